// defines: AlgorithmRequest (comm.algorithm), CostModel and choose_algorithm() — which
// algorithm (algorithms.h) a collective of the peer transport takes, per call, by its size and
// the world: the one a latency/bandwidth model says is fastest, unless the config forces one.
// The model, its constants and how they were measured: Note [Choosing an algorithm] in
// algorithm_choice.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/collective_call.h"

namespace partrain::comm {

// comm.algorithm: auto, or one family forced for every collective that has it.
enum class AlgorithmRequest : std::uint8_t { automatic, ring, recursive_doubling, rabenseifner };
std::vector<std::string> algorithm_request_names();  // auto, ring, recursive_doubling, rabenseifner
// Throws UsageError naming the accepted values.
AlgorithmRequest parse_algorithm_request(std::string_view name);
std::string_view algorithm_request_name(AlgorithmRequest request);

// Seconds per message (alpha), per byte moved through one rank's link (beta), per byte
// reduced (gamma), and per byte that leaves the busiest host for another, on top of beta
// (beta_link; HostTraffic).
struct CostModel {
  double alpha = 0;
  double beta = 0;
  double gamma = 0;
  double beta_link = 0;
};
// alpha, beta and gamma measured on loopback TCP; beta_link a 10 Gbit/s link (Note [Choosing
// an algorithm]).
CostModel loopback_model();

// How much of an allreduce's buffer each algorithm sends out of the busiest host, in buffers,
// for ranks on hosts as `host_of` (rank -> host) places them: what the link between hosts
// carries. Nothing on one host. And whether ranks take turns on a core somewhere
// (HostLayout::shares_cores(), which the caller fills in): then an automatic allreduce below
// 8 MiB leaves the ring out (Note [Choosing an algorithm]).
struct HostTraffic {
  bool between_hosts = false;  // two hosts or more
  bool shared_cores = false;
  double ring = 0;
  double recursive_doubling = 0;
  double rabenseifner = 0;
};
HostTraffic host_traffic(const std::vector<int>& host_of);
// Where ranks share cores, an automatic allreduce may take the ring from this size on (Note
// [Choosing an algorithm]).
inline constexpr std::size_t kSharedCoresRingFrom = 8 << 20;

// The algorithms that can carry a collective, in the order the model breaks ties.
std::vector<Algorithm> algorithms_for(CollectiveKind kind);
// Predicted time of one collective moving `bytes` (allreduce: the buffer; reduce_scatter: the
// input of one rank; allgather: the output; broadcast: the message) among `world` ranks.
// chunk_bytes: the ring's pipeline chunk (broadcast's chain). traffic: where the ranks run,
// when known (null: one host).
double predicted_seconds(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                         const CostModel& model, std::size_t chunk_bytes,
                         const HostTraffic* traffic = nullptr);
// Per message and per byte counts of an algorithm: predicted = messages * alpha + bytes_moved *
// beta + bytes_reduced * gamma + bytes_between_hosts * beta_link (bench's fit divides by them).
struct CostTerms {
  double messages = 0;
  double bytes_moved = 0;
  double bytes_reduced = 0;
  double bytes_between_hosts = 0;  // allreduce over several hosts only
};
CostTerms cost_terms(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                     std::size_t chunk_bytes, const HostTraffic* traffic = nullptr);

// The forced family's algorithm for this collective, else the model's fastest (for an
// allreduce below 8 MiB where traffic says ranks share cores, the fastest but the ring).
Algorithm choose_algorithm(CollectiveKind kind, std::size_t bytes, int world,
                           AlgorithmRequest request, const CostModel& model,
                           std::size_t chunk_bytes, const HostTraffic* traffic = nullptr);
// Whether choose_algorithm()'s answer for this call may depend on where the ranks run: an
// automatic allreduce at three ranks or more, of any size (over two hosts of many ranks each,
// recursive doubling sends every rank's whole buffer across at its step between the hosts; on a
// host whose ranks share cores, the ring is left out below 8 MiB).
// The same on every rank for the same call.
bool choice_depends_on_hosts(CollectiveKind kind, int world, AlgorithmRequest request);

}  // namespace partrain::comm
