// The tcp store port: a byte stream played through the server's parsing and serving exactly
// as a Session does (hello, token, then requests; a join's hello, its key set, then requests; or
// a notice's hello and its line), minus the
// socket. Values set are checked to read back, and no announced size is allocated before it is
// checked.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm_backends/store/tcp_store.h"
#include "fuzz/fuzz_targets.h"

namespace partrain::fuzz {

namespace {

// Takes `bytes` bytes off the front of the stream, or reports the stream too short.
struct Stream {
  const std::uint8_t* at;
  std::size_t left;
  bool take(std::size_t bytes, const std::uint8_t*& out) {
    if (bytes > left) return false;
    out = at;
    at += bytes;
    left -= bytes;
    return true;
  }
};

std::uint32_t response_length(const std::vector<std::uint8_t>& response) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{response[1 + i]} << (8 * i);
  return v;
}

}  // namespace

void fuzz_store(const std::uint8_t* data, std::size_t size) {
  const std::string token = "run-token";
  Stream stream{data, size};
  const std::uint8_t* hello = nullptr;
  if (!stream.take(comm::kStoreHelloBytes, hello)) return;
  // A notice: its announced length checked before it is read, and kept as one line.
  if (std::uint32_t text_bytes = 0; comm::parse_store_notice(hello, text_bytes)) {
    if (text_bytes > comm::kMaxNoticeBytes) throw InvariantBroken("store: oversized notice passes");
    const std::uint8_t* text = nullptr;
    if (!stream.take(text_bytes, text)) return;
    const std::string line = comm::notice_line(std::vector<std::uint8_t>(text, text + text_bytes));
    if (line.size() != text_bytes || std::any_of(line.begin(), line.end(), [](char c) {
          return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
        })) {
      throw InvariantBroken("store: a notice keeps a control byte or changes length");
    }
    return;
  }
  comm::StoreTable table;
  // A join's hello: the payload's announced length checked before it is read; the token, key
  // and value it holds within their limits and, built again, the same bytes.
  if (std::uint32_t payload_bytes = 0; comm::parse_store_join(hello, payload_bytes)) {
    if (payload_bytes > 8 + comm::kMaxTokenBytes + comm::kMaxKeyBytes + comm::kMaxJoinValueBytes) {
      throw InvariantBroken("store: oversized join passes");
    }
    const std::uint8_t* payload_at = nullptr;
    if (!stream.take(payload_bytes, payload_at)) return;
    const std::vector<std::uint8_t> payload(payload_at, payload_at + payload_bytes);
    const auto join = comm::parse_store_join_payload(payload);
    if (!join) return;
    if (join->token.size() > comm::kMaxTokenBytes || join->key.empty() ||
        join->key.size() > comm::kMaxKeyBytes || join->value.size() > comm::kMaxJoinValueBytes ||
        comm::store_join_payload(*join) != payload) {
      throw InvariantBroken("store: a join's payload passes out of bounds or reads back changed");
    }
    if (join->token != token) return;
    table[join->key] = join->value;
  } else {
    std::uint32_t token_bytes = 0;
    if (!comm::parse_store_hello(hello, token_bytes)) return;
    if (token_bytes > comm::kMaxTokenBytes) throw InvariantBroken("store: oversized token passes");
    const std::uint8_t* their_token = nullptr;
    if (!stream.take(token_bytes, their_token)) return;
    if (std::string(their_token, their_token + token_bytes) != token) return;
  }

  std::vector<std::uint8_t> response;
  const std::uint8_t* header = nullptr;
  while (stream.take(comm::kStoreRequestBytes, header)) {
    comm::StoreRequestHeader request;
    if (!comm::parse_store_request(header, request)) return;
    if (request.key_bytes == 0 || request.key_bytes > comm::kMaxKeyBytes ||
        request.value_bytes > comm::kMaxValueBytes) {
      throw InvariantBroken("store: a request with sizes out of bounds passes");
    }
    const std::uint8_t* body_bytes = nullptr;
    if (!stream.take(std::size_t{request.key_bytes} + request.value_bytes, body_bytes)) return;
    const std::vector<std::uint8_t> body(body_bytes,
                                         body_bytes + request.key_bytes + request.value_bytes);
    comm::StoreWait wait;
    const comm::StoreServed served =
        comm::serve_store_request(table, request, body, response, wait);
    if (served == comm::StoreServed::drop) return;
    if (served == comm::StoreServed::wait) {
      // Parked: some key must be absent, and the answer it gets on a timeout well formed.
      if (wait.keys.empty() || comm::first_missing(table, wait.keys) == wait.keys.size()) {
        throw InvariantBroken("store: a wait parks with every key present");
      }
      const auto timed_out =
          wait.many ? comm::store_many_timed_out(0) : comm::store_wait_answer(nullptr, false);
      if (timed_out.size() != comm::kStoreResponseBytes + (wait.many ? 4 : 0) ||
          timed_out[0] != 2) {
        throw InvariantBroken("store: a wait's timeout answer is malformed");
      }
      continue;
    }
    if (!wait.keys.empty())
      throw InvariantBroken("store: an answered request leaves keys to wait for");
    if (response.size() < comm::kStoreResponseBytes ||
        response.size() != comm::kStoreResponseBytes + response_length(response)) {
      throw InvariantBroken("store: response length field disagrees with the response");
    }
    if (request.command == 1) {  // set: the value must read back
      const std::string key(body.begin(), body.begin() + request.key_bytes);
      const auto it = table.find(key);
      if (it == table.end() || !std::equal(it->second.begin(), it->second.end(),
                                           body.begin() + request.key_bytes, body.end())) {
        throw InvariantBroken("store: a value set does not read back");
      }
    }
  }
}

}  // namespace partrain::fuzz
