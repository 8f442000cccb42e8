#include "comm_backends/communicator.h"

#include <optional>

#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/backends/backend.h"
#include "comm_backends/checked_communicator.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

namespace {

// The order is `auto`'s rule: the first entry compiled in and usable for the placement wins.
constinit const BackendEntry* const kBackends[] = {
    &kNcclBackend,          // CUDA buffers on Linux: NCCL reduces device memory itself
    &kShmBackend,           // several ranks, one host: memory instead of loopback TCP
    &kHierarchicalBackend,  // several hosts, several ranks on some: memory inside, TCP across
    &kAsioRingBackend,      // anything else: the TCP ring, usable everywhere
    &kGlooBackend,          // by name only: asio-ring, before it, runs wherever gloo does
};

const BackendEntry& named_backend(const std::string& name) {
  for (const BackendEntry* entry : kBackends) {
    if (entry->name == name) return *entry;
  }
  std::string known;
  for (const auto& n : backend_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("unknown comm backend '" + name + "' (expected one of " + known + ")");
}

const BackendEntry& chosen_backend(const std::string& requested, const Placement& placement) {
  if (requested != "auto") return named_backend(requested);
  for (const BackendEntry* entry : kBackends) {
    if (entry->compiled_in && !entry->usable(placement)) return *entry;
  }
  throw Error("no comm backend is usable for this placement; asio-ring should always be");
}

void check_options(const CommOptions& options, int rank, int size) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "rank ", rank,
                 " is outside a world of ", size);
  PARTRAIN_CHECK(options.timeout.count() > 0, UsageError, "comm timeout must be positive");
  PARTRAIN_CHECK(options.wire_dtype == DType::f32 || options.wire_dtype == DType::f16 ||
                     options.wire_dtype == DType::bf16,
                 UsageError, "comm.wire_dtype must be f32, f16 or bf16, not ",
                 dtype_name(options.wire_dtype));
  parse_algorithm_request(options.algorithm);  // throws UsageError naming the accepted ones
}

}  // namespace

std::optional<std::string> usable_anywhere(const Placement&) { return std::nullopt; }

std::string timeout_seconds_problem(double seconds) {
  if (seconds >= kMinTimeoutSeconds && seconds <= kMaxTimeoutSeconds) return "";
  return detail::concat(seconds, " is out of range (", kMinTimeoutSeconds, " to ",
                        kMaxTimeoutSeconds, " s)");
}

std::string tcp_congestion_problem(const std::string& request) {
  return net::congestion_problem(request);
}

std::string describe_tcp_congestion() {
  const std::string system = net::system_congestion_control();
  const std::string own = net::auto_congestion_control();
  if (system.empty() || own.empty())
    return "the system's (this system does not let partrain choose)";
  return "system default " + system + "; auto: " + own + " between ranks of one machine, " +
         system + " between machines";
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendEntry* entry : kBackends) names.push_back(entry->name);
  names.push_back("auto");
  return names;
}

bool backend_compiled_in(const std::string& name) {
  if (name == "auto") return true;
  for (const BackendEntry* entry : kBackends) {
    if (entry->name == name) return entry->compiled_in;
  }
  return false;
}

std::string choose_backend(const std::string& requested, const Placement& placement) {
  return chosen_backend(requested, placement).name;
}

std::vector<BackendStatus> probe_backends(const Placement& placement) {
  std::vector<BackendStatus> statuses;
  for (const BackendEntry* entry : kBackends) {
    BackendStatus status{entry->name, entry->compiled_in, entry->how_to_get};
    if (entry->compiled_in) status.why_not = entry->usable(placement).value_or("");
    statuses.push_back(std::move(status));
  }
  return statuses;
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store, int rank,
                                                int size) {
  check_options(options, rank, size);
  const RankHosts hosts(store, kHostLayoutPrefix, rank, size);
  return make_communicator(options, store, hosts, rank);
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store,
                                                const RankHosts& hosts, int rank) {
  check_options(options, rank, hosts.ranks());
  // Every rank creates its communicators in the same order, so a per-rank counter gives all
  // ranks the same instance number without talking to each other.
  const std::int64_t instance = store.add("comm/instances/" + std::to_string(rank), 1);
  const Placement placement{options.device, hosts};
  const BackendEntry& backend = chosen_backend(options.backend, placement);
  PARTRAIN_CHECK(backend.compiled_in, UsageError, "comm backend '", backend.name,
                 "' is not compiled into this build: ", backend.how_to_get);
  const std::string prefix = communicator_key_prefix(instance, backend.name);
  return std::make_unique<CheckedCommunicator>(
      backend.make(BackendArgs{options, store, placement, rank, prefix}), store, prefix, instance,
      options.timeout);
}

std::string communicator_key_prefix(std::int64_t instance, const std::string& backend) {
  return "comm/" + std::to_string(instance) + "/" + backend + "/";
}

}  // namespace partrain::comm
