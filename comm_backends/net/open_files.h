// defines: raise_open_file_limit(), open_file_limit() — the per-process limit on open
// descriptors, which bounds how many connections one process can hold (a store server: one
// for each rank).
#pragma once

#include <cstdint>

namespace partrain::comm::net {

struct OpenFileLimit {
  std::uint64_t soft = 0;  // what the process may open now
  std::uint64_t hard = 0;  // how far it may raise that itself
  bool known = false;      // false where the platform has no such limit (Windows)
};

// Raises the soft limit to the hard one (what an unprivileged process may do) and returns
// the limits after that.
OpenFileLimit raise_open_file_limit();
OpenFileLimit open_file_limit();

}  // namespace partrain::comm::net
