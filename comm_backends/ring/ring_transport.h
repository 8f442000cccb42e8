// defines: RingTransport — one rank's two connections in a ring of ranks: to its right
// neighbour (rank+1, we only send) and from its left neighbour (rank-1, we only receive).
// Having a socket per direction gives full duplex with one thread: the kernel moves bytes
// both ways while we reduce.
//
// Setup goes through the store: each rank listens on an ephemeral port of bind_host and
// publishes "host:port" under PREFIX/addr/RANK, connects to its right neighbour and opens
// with a handshake (kRingMagic, protocol version, rank, world size, run token). The accepting
// side checks every field — the caller must be exactly its left neighbour of this run — and
// answers kRingAccept; any other connection (garbage, a wrong token, a stray rank) is closed
// and the rank keeps waiting for the right one until the timeout.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <string>

namespace partrain::comm {

class Store;

inline constexpr char kRingMagic[8] = {'P', 'T', 'R', 'I', 'N', 'G', '0', '1'};
inline constexpr char kRingAccept[8] = {'P', 'T', 'R', 'I', 'N', 'G', 'O', 'K'};
inline constexpr std::uint32_t kRingProtocolVersion = 1;
inline constexpr std::size_t kRingHandshakeBytes = 24;  // magic, version, rank, world, token size
inline constexpr std::uint32_t kRingMaxTokenBytes = 1024;

struct RingTransportOptions {
  std::string token;
  std::string bind_host = "127.0.0.1";
  std::string key_prefix = "asio-ring/";
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  int socket_buffer_bytes = 4 << 20;
};

// The store key under which rank `rank` publishes the "host:port" it listens on.
std::string ring_address_key(const std::string& key_prefix, int rank);

// Encodes the handshake a rank sends to its right neighbour (also used by tests that play a
// stranger with a well-formed but wrong handshake).
std::string encode_ring_handshake(int rank, int world, const std::string& token);

// The accepting side's check of a handshake's fixed part: true when it comes from
// `expected_rank` of a world of `world` and announces a token of `token_bytes` bytes.
bool check_ring_handshake(const char* handshake, int expected_rank, int world,
                          std::size_t token_bytes);

class RingTransport {
 public:
  // Connects the ring; throws PeerError naming a neighbour that did not show up in time.
  RingTransport(Store& store, int rank, int size, const RingTransportOptions& options);
  ~RingTransport();
  RingTransport(const RingTransport&) = delete;
  RingTransport& operator=(const RingTransport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int right() const { return (rank_ + 1) % size_; }

  boost::asio::io_context& io() { return io_; }
  boost::asio::ip::tcp::socket& to_right() { return to_right_; }
  boost::asio::ip::tcp::socket& from_left() { return from_left_; }

  // After a failure the byte streams are out of step: close both, refuse further use.
  void break_ring();
  bool broken() const { return broken_; }

 private:
  void connect(Store& store, const RingTransportOptions& options);

  int rank_;
  int size_;
  bool broken_ = false;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket to_right_;
  boost::asio::ip::tcp::socket from_left_;
};

}  // namespace partrain::comm
