#include "comm_backends/ring/ring_transport.h"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "comm_backends/net/timed_io.h"
#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
#include "common/errors.h"

namespace partrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::Clock;

namespace {

// The accepting half of the setup: every incoming connection is a candidate until its
// handshake proves it is our left neighbour; the first that does becomes from_left.
struct AcceptState {
  AcceptState(asio::io_context& io, int expected_rank, int world, std::string token)
      : acceptor(io), expected_rank(expected_rank), world(world), token(std::move(token)) {}

  struct Candidate {
    explicit Candidate(tcp::socket s) : socket(std::move(s)) {}
    tcp::socket socket;
    char header[kRingHandshakeBytes] = {};
    std::string token;
  };

  tcp::acceptor acceptor;
  int expected_rank;
  int world;
  std::string token;
  std::vector<std::shared_ptr<Candidate>> candidates;
  std::unique_ptr<tcp::socket> accepted;
  int refused = 0;

  void refuse(const std::shared_ptr<Candidate>& candidate) {
    boost::system::error_code ignored;
    candidate->socket.close(ignored);
    ++refused;
  }

  void close_all() {
    boost::system::error_code ignored;
    acceptor.close(ignored);
    for (auto& candidate : candidates) candidate->socket.close(ignored);
  }
};

void accept_next(const std::shared_ptr<AcceptState>& state);

void read_handshake(const std::shared_ptr<AcceptState>& state,
                    const std::shared_ptr<AcceptState::Candidate>& candidate) {
  asio::async_read(
      candidate->socket, asio::buffer(candidate->header, kRingHandshakeBytes),
      [state, candidate](const boost::system::error_code& ec, std::size_t) {
        if (ec || state->accepted) return state->refuse(candidate);
        if (!check_ring_handshake(candidate->header, state->expected_rank, state->world,
                                  state->token.size())) {
          return state->refuse(candidate);
        }
        candidate->token.resize(state->token.size());
        asio::async_read(
            candidate->socket, asio::buffer(candidate->token.data(), candidate->token.size()),
            [state, candidate](const boost::system::error_code& e, std::size_t) {
              if (e || state->accepted || candidate->token != state->token) {
                return state->refuse(candidate);
              }
              asio::async_write(
                  candidate->socket, asio::buffer(kRingAccept, 8),
                  [state, candidate](const boost::system::error_code& w, std::size_t) {
                    if (w || state->accepted) return state->refuse(candidate);
                    state->accepted = std::make_unique<tcp::socket>(std::move(candidate->socket));
                  });
            });
      });
}

void accept_next(const std::shared_ptr<AcceptState>& state) {
  state->acceptor.async_accept([state](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
    if (!ec) {
      auto candidate = std::make_shared<AcceptState::Candidate>(std::move(socket));
      state->candidates.push_back(candidate);
      read_handshake(state, candidate);
    }
    accept_next(state);
  });
}

}  // namespace

bool check_ring_handshake(const char* handshake, int expected_rank, int world,
                          std::size_t token_bytes) {
  return std::memcmp(handshake, kRingMagic, 8) == 0 &&
         get_le<std::uint32_t>(handshake + 8) == kRingProtocolVersion &&
         get_le<std::uint32_t>(handshake + 12) == static_cast<std::uint32_t>(expected_rank) &&
         get_le<std::uint32_t>(handshake + 16) == static_cast<std::uint32_t>(world) &&
         get_le<std::uint32_t>(handshake + 20) == token_bytes;
}

std::string ring_address_key(const std::string& key_prefix, int rank) {
  return key_prefix + "addr/" + std::to_string(rank);
}

std::string encode_ring_handshake(int rank, int world, const std::string& token) {
  std::string message(kRingHandshakeBytes, '\0');
  std::memcpy(message.data(), kRingMagic, 8);
  put_le<std::uint32_t>(message.data() + 8, kRingProtocolVersion);
  put_le<std::uint32_t>(message.data() + 12, static_cast<std::uint32_t>(rank));
  put_le<std::uint32_t>(message.data() + 16, static_cast<std::uint32_t>(world));
  put_le<std::uint32_t>(message.data() + 20, static_cast<std::uint32_t>(token.size()));
  return message + token;
}

RingTransport::RingTransport(Store& store, int rank, int size, const RingTransportOptions& options)
    : rank_(rank), size_(size), to_right_(io_), from_left_(io_) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "ring: rank ", rank,
                 " is outside a world of ", size);
  PARTRAIN_CHECK(options.token.size() <= kRingMaxTokenBytes, UsageError,
                 "ring: run token longer than ", kRingMaxTokenBytes, " bytes");
  if (size > 1) connect(store, options);
}

RingTransport::~RingTransport() {
  boost::system::error_code ignored;
  to_right_.close(ignored);
  from_left_.close(ignored);
}

void RingTransport::connect(Store& store, const RingTransportOptions& options) {
  const auto deadline = net::deadline_after(options.timeout);
  auto state = std::make_shared<AcceptState>(io_, left(), size_, options.token);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.bind_host, ec);
  PARTRAIN_CHECK(!ec, UsageError, "ring: bind host '", options.bind_host,
                 "' is not an IP address of this machine");
  const tcp::endpoint endpoint(address, 0);
  state->acceptor.open(endpoint.protocol(), ec);
  // Buffer sizes set on the listener carry over to accepted sockets before the handshake,
  // when the TCP window scale is fixed.
  if (!ec) {
    state->acceptor.set_option(asio::socket_base::receive_buffer_size(options.socket_buffer_bytes),
                               ec);
    state->acceptor.set_option(asio::socket_base::send_buffer_size(options.socket_buffer_bytes),
                               ec);
    ec.clear();
  }
  if (!ec) state->acceptor.bind(endpoint, ec);
  if (!ec) state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  PARTRAIN_CHECK(!ec, CommError, "ring: cannot listen on ", options.bind_host, ": ", ec.message());
  const int port = state->acceptor.local_endpoint().port();
  const std::string mine = net::join_host_port(options.bind_host, port);
  store.set(ring_address_key(options.key_prefix, rank_),
            std::vector<std::uint8_t>(mine.begin(), mine.end()));
  accept_next(state);

  // Whatever happens below, the accept side must be torn down before `state` goes.
  struct Cleanup {
    std::shared_ptr<AcceptState> state;
    asio::io_context& io;
    ~Cleanup() {
      state->close_all();
      io.restart();
      io.run_for(std::chrono::seconds(1));
    }
  } cleanup{state, io_};

  std::vector<std::uint8_t> right_address;
  try {
    right_address = store.get(ring_address_key(options.key_prefix, right()));
  } catch (const CommError& e) {
    throw PeerError(right(), "ring: rank " + std::to_string(right()) +
                                 " did not publish its address: " + e.what());
  }
  std::string host;
  int right_port = 0;
  const std::string right_text(right_address.begin(), right_address.end());
  PARTRAIN_CHECK(net::split_host_port(right_text, host, right_port), CommError, "ring: rank ",
                 right(), " published a bad address '", right_text, "'");
  if (!net::connect_with_retry(io_, to_right_, host, right_port, deadline,
                               options.socket_buffer_bytes)) {
    throw PeerError(right(), "ring: could not connect to rank " + std::to_string(right()) + " at " +
                                 right_text + " within the timeout");
  }
  const std::string hello = encode_ring_handshake(rank_, size_, options.token);
  auto result = net::write_all(io_, to_right_, hello.data(), hello.size(), deadline);
  char answer[8] = {};
  if (result.ok()) result = net::read_exact(io_, to_right_, answer, 8, deadline);
  if (!result.ok() || std::memcmp(answer, kRingAccept, 8) != 0) {
    throw PeerError(right(), "ring: rank " + std::to_string(right()) + " at " + right_text +
                                 " refused our handshake (another run, or a different token?): " +
                                 (result.ok() ? "bad answer" : result.message));
  }
  if (!net::run_until(
          io_, [&] { return state->accepted != nullptr; }, deadline)) {
    throw PeerError(
        left(),
        "ring: rank " + std::to_string(left()) + " did not connect within the timeout" +
            (state->refused ? " (refused " + std::to_string(state->refused) + " other connections)"
                            : std::string()));
  }
  from_left_ = std::move(*state->accepted);
  net::tune_socket(from_left_, options.socket_buffer_bytes);
}

void RingTransport::break_ring() {
  broken_ = true;
  boost::system::error_code ignored;
  to_right_.close(ignored);
  from_left_.close(ignored);
}

}  // namespace partrain::comm
