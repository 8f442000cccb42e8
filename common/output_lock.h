// defines: OutputLock — one run per output folder: OUTPUT/partrain.lock names the run that
// holds the folder (host, pid, since when, run token), so that a second run cannot write its
// checkpoints and reports over the first's. No LibTorch.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/abrupt_exit.h"

namespace partrain {

struct LockHolder {
  std::string host;
  int pid = 0;
  std::string since;  // UTC, ISO 8601
  std::string token;  // the run token: the nodes of one run share it
};

class OutputLock {
 public:
  static constexpr const char* kFileName = "partrain.lock";

  // Takes OUTPUT/partrain.lock for the run `token`, creating the folder if needed. The lock
  // file appears whole or not at all (written under a temp name, then linked into place, which
  // fails when the name exists). Then:
  //   * held with the same token: another node of this run; shared, and left to its maker;
  //   * held by a pid of this host that no longer runs: stale; taken over, and `note` gets a
  //     line saying so;
  //   * otherwise: throws UsageError naming the holder's host, pid and since when.
  // Released (removed) on destruction when this process made it, and by a stop that ends the
  // process at once (remove_at_abrupt_exit()).
  OutputLock(const std::string& output_dir, const std::string& token,
             const std::function<void(const std::string&)>& note);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool owned() const { return owned_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  LockHolder mine_;
  bool owned_ = false;
  std::unique_ptr<RemovedAtAbruptExit> at_abrupt_exit_;  // while owned
};

// The lock file's text, one "key=value" line per field (host, pid, since, token), and back;
// lock_from_text throws UsageError naming `path` when the text is not a lock.
std::string lock_to_text(const LockHolder& holder);
LockHolder lock_from_text(const std::string& text, const std::string& path);

}  // namespace partrain
