#include "common/output_lock.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/host_name.h"
#include "common/process_state.h"

#ifndef _WIN32
#include <unistd.h>

#include <cerrno>
#endif

namespace partrain {
namespace {

namespace fs = std::filesystem;

// A stale lock is removed and the lock taken again; another run may race for it, so the
// attempts are bounded.
constexpr int kMaxAttempts = 3;

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
#ifdef _WIN32
  gmtime_s(&tm, &now);
#else
  gmtime_r(&now, &tm);
#endif
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Makes `path` hold `text` unless it exists: true when this call made it. The text goes to a
// temp name first, so a reader never finds the lock half written.
bool create_exclusively(const std::string& path, const std::string& text) {
  const std::string temp = temp_path_for(path);
  {
    std::ofstream out(temp, std::ios::binary);
    out << text;
    PARTRAIN_CHECK(out.good(), UsageError, "cannot write the output lock ", temp);
  }
  sync_file(temp);
#ifdef _WIN32
  // rename() fails on Windows when the new name exists.
  const bool made = std::rename(temp.c_str(), path.c_str()) == 0;
  if (!made) std::remove(temp.c_str());
#else
  const bool made = ::link(temp.c_str(), path.c_str()) == 0;
  const int error = errno;
  ::unlink(temp.c_str());
  PARTRAIN_CHECK(made || error == EEXIST, UsageError, "cannot create the output lock ", path, ": ",
                 std::strerror(error));
#endif
  return made;
}

}  // namespace

std::string lock_to_text(const LockHolder& holder) {
  return "host=" + holder.host + "\npid=" + std::to_string(holder.pid) + "\nsince=" + holder.since +
         "\ntoken=" + holder.token + "\n";
}

LockHolder lock_from_text(const std::string& text, const std::string& path) {
  LockHolder holder;
  std::istringstream lines(text);
  std::string line;
  bool has_pid = false;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "host") holder.host = value;
    if (key == "since") holder.since = value;
    if (key == "token") holder.token = value;
    if (key == "pid") {
      char* end = nullptr;
      const long pid = std::strtol(value.c_str(), &end, 10);
      has_pid = end != value.c_str() && *end == '\0' && pid > 0 && pid < (1L << 30);
      holder.pid = has_pid ? static_cast<int>(pid) : 0;
    }
  }
  PARTRAIN_CHECK(has_pid && !holder.host.empty(), UsageError, "output lock ", path,
                 " is not readable; if no run uses this folder, remove it");
  return holder;
}

OutputLock::OutputLock(const std::string& output_dir, const std::string& token,
                       const std::function<void(const std::string&)>& note)
    : path_(output_dir + "/" + kFileName) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  PARTRAIN_CHECK(!ec, UsageError, "cannot create the output directory ", output_dir, ": ",
                 ec.message());
  mine_ = LockHolder{this_host_name(), static_cast<int>(current_process_id()), utc_now(), token};
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (create_exclusively(path_, lock_to_text(mine_))) {
      owned_ = true;
      at_abrupt_exit_ = std::make_unique<RemovedAtAbruptExit>(path_);
      return;
    }
    const LockHolder holder = lock_from_text(read_text(path_), path_);
    if (!token.empty() && holder.token == token) return;  // another node of this run
    const bool here = holder.host == mine_.host;
    if (here && !process_alive(holder.pid)) {
      note("output folder " + output_dir + " was locked by pid " + std::to_string(holder.pid) +
           " on this host (" + holder.host + ", since " + holder.since +
           "), which is gone: taking the stale lock over");
      fs::remove(path_, ec);
      continue;
    }
    throw UsageError("output folder " + output_dir + " is in use by another run: pid " +
                     std::to_string(holder.pid) + " on host " + holder.host + " since " +
                     holder.since + " (" + path_ +
                     "); use another output.dir, or remove the lock if that run is gone");
  }
  throw UsageError("output folder " + output_dir + ": could not take its lock " + path_ +
                   " after " + std::to_string(kMaxAttempts) + " attempts (another run races)");
}

OutputLock::~OutputLock() {
  if (!owned_) return;
  // Only while it is still ours: a lock taken over meanwhile belongs to its new holder.
  try {
    const LockHolder holder = lock_from_text(read_text(path_), path_);
    if (holder.pid == mine_.pid && holder.token == mine_.token && holder.since == mine_.since) {
      std::error_code ec;
      fs::remove(path_, ec);
    }
  } catch (const Error&) {
    // Unreadable or gone: nothing of ours to remove.
  }
}

}  // namespace partrain
