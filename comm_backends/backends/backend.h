// defines: BackendEntry — what each backend file registers, in one line: its name, whether it
// is compiled in, "may `auto` take me for this placement, and if not, why?" and "make one" —
// with BackendArgs and make_backend<>() for that line, and the entries themselves (listed in
// the order `auto` tries them in communicator.cpp). What a backend makes is wrapped in a
// CheckedCommunicator (checked_communicator.h), which locks, checks buffers against the
// backend's Capabilities, records and traces failures: a backend does none of that itself.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm_backends/communicator.h"
#include "comm_backends/placement.h"

namespace partrain::comm {

// Everything a backend's communicator is made from.
struct BackendArgs {
  const CommOptions& options;
  Store& store;
  const Placement& placement;  // where every rank of the group runs; only during make()
  int rank;
  std::string prefix;  // a store key prefix unique to this communicator on every rank
  int size() const { return placement.hosts.ranks(); }
};

// Plain data (a name, flags, function pointers), so that each entry is a constant that exists
// before any code runs, whichever file defines it.
struct BackendEntry {
  const char* name;
  bool compiled_in;
  const char* how_to_get;  // not compiled in: how to build it, or what to use instead
  // Why `auto` may not take it for this placement; nothing when it may. Only asked of an
  // entry compiled in; a backend named explicitly is made without asking.
  std::optional<std::string> (*usable)(const Placement& placement);
  std::unique_ptr<Communicator> (*make)(const BackendArgs& args);
};

// Where rank `rank` of the asio-ring communicator whose keys start with `prefix`
// (communicator_key_prefix()) publishes the address of its ring port.
std::string asio_ring_address_key(const std::string& prefix, int rank);

template <typename CommunicatorType>
std::unique_ptr<Communicator> make_backend(const BackendArgs& args) {
  return std::make_unique<CommunicatorType>(args);
}

// For backends that run wherever there is TCP: the callers stage CUDA buffers through host
// memory for every backend but nccl.
std::optional<std::string> usable_anywhere(const Placement& placement);

// One per file in backends/.
extern const BackendEntry kNcclBackend;
extern const BackendEntry kShmBackend;
extern const BackendEntry kHierarchicalBackend;
extern const BackendEntry kAsioRingBackend;
extern const BackendEntry kGlooBackend;

}  // namespace partrain::comm
