#include "common/abrupt_exit.h"

#include <algorithm>
#include <atomic>

#ifdef _WIN32
#include <io.h>
#else
#include <unistd.h>
#endif

namespace partrain {
namespace {

// A slot is free, being filled or emptied (the handler skips it), or held.
constexpr int kFree = 0;
constexpr int kBusy = 1;
constexpr int kHeld = 2;

struct Slot {
  std::atomic<int> state{kFree};
  char path[RemovedAtAbruptExit::kPathBytes] = {};
};
Slot g_slots[RemovedAtAbruptExit::kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler reads the slots");

}  // namespace

RemovedAtAbruptExit::RemovedAtAbruptExit(const std::string& path) {
  if (path.empty() || path.size() >= kPathBytes) return;
  for (int i = 0; i < kSlots; ++i) {
    int state = kFree;
    if (!g_slots[i].state.compare_exchange_strong(state, kBusy)) continue;
    std::copy_n(path.c_str(), path.size() + 1, g_slots[i].path);
    g_slots[i].state = kHeld;
    slot_ = i;
    return;
  }
}

RemovedAtAbruptExit::~RemovedAtAbruptExit() {
  if (slot_ < 0) return;
  g_slots[slot_].state = kBusy;
  g_slots[slot_].path[0] = '\0';
  g_slots[slot_].state = kFree;
}

void remove_at_abrupt_exit() {
  for (Slot& slot : g_slots) {
    int state = kHeld;
    // Taken for good: the process ends next.
    if (!slot.state.compare_exchange_strong(state, kBusy)) continue;
#ifdef _WIN32
    (void)::_unlink(slot.path);
#else
    (void)::unlink(slot.path);
#endif
  }
}

}  // namespace partrain
