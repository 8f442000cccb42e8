// defines: Backend — what each backend file registers (name, compiled in or not, "am I
// usable for these options?", "make one"), the ordered list that `auto` walks, and the
// buffer checks every backend shares.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/communicator.h"

namespace partrain::comm {

struct Backend {
  std::string name;
  bool compiled_in = false;
  std::string how_to_get;  // for a backend not compiled in: how to build it, what to use instead
  std::function<bool(const CommOptions&)> usable;  // may `auto` pick it for these options?
  // prefix: a store key prefix unique to this communicator on every rank.
  std::function<std::unique_ptr<Communicator>(const CommOptions&, Store&, int rank, int size,
                                              const std::string& prefix)>
      make;
};

// Where rank `rank` of the asio-ring communicator whose keys start with `prefix`
// (communicator_key_prefix()) publishes the address of its ring port.
std::string asio_ring_address_key(const std::string& prefix, int rank);

Backend nccl_backend();
Backend asio_ring_backend();
Backend shm_backend();
Backend hierarchical_backend();
Backend gloo_backend();

// In the order `auto` tries them.
const std::vector<Backend>& backends();

void check_host_buffer(const Buffer& buffer, const std::string& backend);
void check_allgather_buffers(const Buffer& in, const Buffer& out, int size);

}  // namespace partrain::comm
