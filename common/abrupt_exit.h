// defines: RemovedAtAbruptExit and remove_at_abrupt_exit() — files a process that ends at once
// (a stop in a rank's start-up, common/stop_request.h: _exit, no destructor runs) removes
// first: the output folder's lock, a shared-memory region not yet unlinked. What a SIGKILL
// would leave behind, an exit of partrain's own choosing does not. No LibTorch.
#pragma once

#include <cstddef>
#include <string>

namespace partrain {

// While one lives, remove_at_abrupt_exit() removes `path`. It holds one of kSlots fixed slots,
// which a signal handler can walk; a path longer than kPathBytes - 1, or one past the slots,
// is not held (an abrupt exit then leaves it, as a kill would). Removing it stays the owner's
// job on an ordinary exit.
class RemovedAtAbruptExit {
 public:
  static constexpr int kSlots = 8;
  static constexpr std::size_t kPathBytes = 512;

  explicit RemovedAtAbruptExit(const std::string& path);
  ~RemovedAtAbruptExit();
  RemovedAtAbruptExit(const RemovedAtAbruptExit&) = delete;
  RemovedAtAbruptExit& operator=(const RemovedAtAbruptExit&) = delete;

 private:
  int slot_ = -1;
};

// Removes every path held now. Async-signal-safe on POSIX (unlink()).
void remove_at_abrupt_exit();

}  // namespace partrain
