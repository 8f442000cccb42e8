// defines: AlgorithmRequest (comm.algorithm), CostModel and choose_algorithm() — which
// algorithm (algorithms.h) a collective of the peer transport takes, per call, by its size and
// the world: the one a latency/bandwidth model says is fastest, unless the config forces one.
// The model, its constants and how they were measured: Note [Choosing an algorithm] in
// algorithm_choice.cpp.
#pragma once

#include <cstddef>
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

// Seconds per message (alpha), per byte moved through one rank's link (beta) and per byte
// reduced (gamma).
struct CostModel {
  double alpha = 0;
  double beta = 0;
  double gamma = 0;
};
// Measured on loopback TCP (Note [Choosing an algorithm]).
CostModel loopback_model();

// The algorithms that can carry a collective, in the order the model breaks ties.
std::vector<Algorithm> algorithms_for(CollectiveKind kind);
// Predicted time of one collective moving `bytes` (allreduce: the buffer; reduce_scatter: the
// input of one rank; allgather: the output; broadcast: the message) among `world` ranks.
// chunk_bytes: the ring's pipeline chunk (broadcast's chain).
double predicted_seconds(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                         const CostModel& model, std::size_t chunk_bytes);
// Per message and per byte counts of an algorithm: predicted = messages * alpha + bytes_moved *
// beta + bytes_reduced * gamma (bench's fit divides by them).
struct CostTerms {
  double messages = 0;
  double bytes_moved = 0;
  double bytes_reduced = 0;
};
CostTerms cost_terms(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                     std::size_t chunk_bytes);

// The forced family's algorithm for this collective, else the model's fastest.
Algorithm choose_algorithm(CollectiveKind kind, std::size_t bytes, int world,
                           AlgorithmRequest request, const CostModel& model,
                           std::size_t chunk_bytes);

}  // namespace partrain::comm
