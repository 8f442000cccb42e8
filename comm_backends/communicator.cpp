#include "comm_backends/communicator.h"

#include "comm_backends/backends/backend.h"
#include "comm_backends/shm/host_identity.h"
#include "common/errors.h"
#include "comm_backends/store/store.h"

namespace partrain::comm {

const std::vector<Backend>& backends() {
  // The first usable one wins for `auto`; gloo is never usable for auto (asio-ring does
  // what it does on CPU, faster) but stays available by name.
  static const std::vector<Backend> list = {nccl_backend(), asio_ring_backend(), shm_backend(),
                                            hierarchical_backend(), gloo_backend()};
  return list;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& backend : backends()) names.push_back(backend.name);
  names.push_back("auto");
  return names;
}

bool backend_compiled_in(const std::string& name) {
  if (name == "auto") return true;
  for (const auto& backend : backends()) {
    if (backend.name == name) return backend.compiled_in;
  }
  return false;
}

std::string resolve_backend(const CommOptions& options) {
  if (options.backend != "auto") return options.backend;
  for (const auto& backend : backends()) {
    if (backend.compiled_in && backend.usable && backend.usable(options)) return backend.name;
  }
  return "asio-ring";
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store, int rank,
                                                int size) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "rank ", rank,
                 " is outside a world of ", size);
  PARTRAIN_CHECK(options.timeout.count() > 0, UsageError, "comm timeout must be positive");
  PARTRAIN_CHECK(options.wire_dtype == DType::f32 || options.wire_dtype == DType::f16 ||
                     options.wire_dtype == DType::bf16,
                 UsageError, "comm.wire_dtype must be f32, f16 or bf16, not ",
                 dtype_name(options.wire_dtype));
  // Every rank creates its communicators in the same order, so a per-rank counter gives all
  // ranks the same instance number without talking to each other.
  const std::int64_t instance = store.add("comm/instances/" + std::to_string(rank), 1);
  std::string name = resolve_backend(options);
  if (options.backend == "auto" && name == "asio-ring" && size > 1) {
    const HostLayout layout = group_by_host(exchange_host_identities(
        store, "comm/" + std::to_string(instance) + "/hosts/", rank, size));
    if (layout.hosts.size() == 1) {
      name = "shm";  // same results as asio-ring, through memory instead of loopback TCP
    } else if (layout.hosts.size() < static_cast<std::size_t>(size)) {
      name = "hierarchical";  // fewer bytes across hosts than the flat ring, memory inside
    }
  }
  const Backend* chosen = nullptr;
  for (const auto& backend : backends()) {
    if (backend.name == name) chosen = &backend;
  }
  if (chosen == nullptr) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
    throw UsageError("unknown comm backend '" + name + "' (expected one of " + known + ")");
  }
  PARTRAIN_CHECK(chosen->compiled_in, UsageError, "comm backend '", name,
                 "' is not compiled into this build: ", chosen->how_to_get);
  return chosen->make(options, store, rank, size, communicator_key_prefix(instance, name));
}

std::string communicator_key_prefix(std::int64_t instance, const std::string& backend) {
  return "comm/" + std::to_string(instance) + "/" + backend + "/";
}

void check_host_buffer(const Buffer& buffer, const std::string& backend) {
  PARTRAIN_CHECK(buffer.device == DeviceKind::cpu, UsageError, "comm backend '", backend,
                 "' works on CPU buffers; use nccl (Linux with CUDA) for CUDA buffers");
  PARTRAIN_CHECK(buffer.count == 0 || buffer.data != nullptr, UsageError,
                 "collective on a null buffer of ", buffer.count, " elements");
}

void check_allgather_buffers(const Buffer& in, const Buffer& out, int size) {
  PARTRAIN_CHECK(in.dtype == out.dtype, UsageError, "allgather: input is ", dtype_name(in.dtype),
                 " but output is ", dtype_name(out.dtype));
  PARTRAIN_CHECK_EQ(out.count, in.count * static_cast<std::size_t>(size), UsageError,
                    "allgather: the output's element count is not ", size, " x ", in.count);
}

}  // namespace partrain::comm
