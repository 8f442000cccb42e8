#include "comm_backends/backends/peer_process.h"

#include <charconv>
#include <string_view>
#include <utility>
#include <vector>

#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
#include "common/process_state.h"

namespace partrain::comm {

std::string process_key(int rank) { return "ranks/process/" + std::to_string(rank); }

void publish_process_on_join(StoreOptions& options, int rank) {
  const std::string text = encode_process_mark(this_process());
  options.join_key = process_key(rank);
  options.join_value.assign(text.begin(), text.end());
}

namespace {

// The rank the process serving `store` said it is, and its mark; nullopt where it said none.
std::optional<std::pair<int, ProcessMark>> serving_rank(const Store& store) {
  const auto server = store.server_process();
  constexpr std::string_view kRank = "rank ";
  if (!server || !server->role.starts_with(kRank)) return std::nullopt;
  int rank = -1;
  const std::string_view number = std::string_view(server->role).substr(kRank.size());
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), rank);
  if (error != std::errc() || end != number.data() + number.size() || rank < 0) {
    return std::nullopt;
  }
  const auto mark = decode_process_mark(server->mark);
  if (!mark) return std::nullopt;
  return std::make_pair(rank, *mark);
}

// The sentence for the rank serving the store, from what its process shows. An ended process is
// said plainly: whether it said why went with its store.
std::string serving_rank_sentence(int rank, const ProcessMark& mark, const ProcessState& state) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(mark.pid) + ", this machine) " +
         (state.kind == ProcessState::Kind::ended
              ? std::string("has exited, and the store it served with it")
              : describe_process_state(state, mark.pid));
}

// Rank `rank` as the process serving `store`, where the server said it is that rank: the look
// at rank 0 when its store, gone or frozen with it, cannot give its published mark.
std::optional<std::string> look_at_serving_rank(const Store& store, int rank) {
  const auto serving = serving_rank(store);
  if (!serving || serving->first != rank) return std::nullopt;
  const auto state = watch_marked_process(serving->second);
  if (!state) return std::nullopt;
  return serving_rank_sentence(rank, serving->second, *state);
}

}  // namespace

std::optional<ServingRankSeen> serving_rank_gone(const Store& store) {
  try {
    const auto serving = serving_rank(store);
    if (!serving || serving->second.pid == current_process_id()) return std::nullopt;
    const auto state = watch_marked_process(serving->second);
    using Kind = ProcessState::Kind;
    if (!state || (state->kind != Kind::ended && state->kind != Kind::stopped &&
                   state->kind != Kind::traced)) {
      return std::nullopt;
    }
    return ServingRankSeen{serving->first,
                           serving_rank_sentence(serving->first, serving->second, *state)};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::string> look_at_rank_process(Store& store, int rank,
                                                std::chrono::milliseconds bound) {
  try {
    const auto published = try_get(store, process_key(rank), bound);
    if (!published) return look_at_serving_rank(store, rank);
    const auto mark = decode_process_mark(bytes_as_text(*published));
    if (!mark) return std::nullopt;
    const auto seen = look_at_process(*mark);
    if (!seen) return std::nullopt;
    return "rank " + std::to_string(rank) + " (pid " + std::to_string(mark->pid) +
           ", this machine) " + *seen;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace partrain::comm
