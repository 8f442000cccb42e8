// defines: PeerTransport — one rank's connections to any other rank of its group, made when
// first needed and kept (Gloo's pairs, NCCL's lazy connections), and the one-thread engine
// that moves the bytes of a collective's messages over them. The algorithms
// (comm_backends/algorithms/) see only this and their buffers. Note [Peer transport] in
// peer_transport.cpp tells how connections are made and how a message travels.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/collective_call.h"

namespace partrain::comm {

class Store;

inline constexpr char kPeerMagic[8] = {'P', 'T', 'P', 'E', 'E', 'R', '0', '1'};
inline constexpr char kPeerAccept[8] = {'P', 'T', 'P', 'E', 'E', 'R', 'O', 'K'};
inline constexpr std::uint32_t kPeerProtocolVersion = 2;
inline constexpr std::size_t kPeerHandshakeBytes = 24;  // magic, version, rank, world, token size
inline constexpr std::uint32_t kPeerMaxTokenBytes = 1024;
inline constexpr std::size_t kFrameHeaderBytes = 32;

struct PeerTransportOptions {
  std::string token;
  std::string bind_host = "127.0.0.1";
  std::string key_prefix = "peers/";
  std::string name = "asio-ring";  // how errors name the backend
  // Bound on each collective (from begin() to end()), connections made during it included.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  int socket_buffer_bytes = 4 << 20;
  // How long a wait for bytes looks at the sockets again before it sleeps in the kernel,
  // yielding the core between looks; 0 sleeps at once. A peer's reply on loopback or a fast
  // link usually comes within 50 us, and a wake-up from poll() costs more than a message.
  // With more ranks than cores the yield hands the core to a rank that can run, so the spin
  // pays there too (BENCHMARKS.md, "Collectives for many ranks").
  std::chrono::microseconds spin{50};
  // The TCP congestion control of each connection: auto | system | a name (net::
  // set_congestion_control(); Note [Congestion control on one machine] in net/timed_io.cpp).
  std::string tcp_congestion = "auto";
  // The machine this rank tells its peers it runs on; empty: kernel_identity() (tests give
  // ranks of one machine different ones to play two machines).
  std::string machine;
};

// What a rank publishes under peer_address_key(): where it listens ("host:port"; empty for
// rank 0, which never listens) and the machine it runs on, as "HOST:PORT\nMACHINE".
struct PeerAddress {
  std::string listen;
  std::string machine;
};
std::string encode_peer_address(const PeerAddress& address);
PeerAddress decode_peer_address(const std::string& text);

// The store key under which rank `rank` publishes its PeerAddress.
std::string peer_address_key(const std::string& key_prefix, int rank);
// Set by a rank whose transport went while it unwound from an error (its set-up failed after
// the communicator was made, or a collective failed): a higher rank waiting for it to connect
// finds it there instead of waiting out the collective's deadline.
std::string peer_gone_key(const std::string& key_prefix, int rank);
// How long a collective waits for a lower rank to connect before it looks in the store whether
// that rank is gone, and again after each look.
inline constexpr std::chrono::milliseconds kPeerGoneLookEvery{1000};
// The most a transport going while its rank unwinds waits to set peer_gone_key().
inline constexpr std::chrono::milliseconds kPeerGoneSetBound{2000};

// The handshake a rank sends to a higher rank it connects to (also used by tests that play a
// stranger with a well-formed but wrong handshake).
std::string encode_peer_handshake(int rank, int world, const std::string& token);

// The accepting side's check of a handshake's fixed part: the rank it announces when that
// is a rank below `acceptor` of a world of `world` announcing a token of `token_bytes` bytes
// (only lower ranks connect to a rank), else -1.
int check_peer_handshake(const char* handshake, int acceptor, int world, std::size_t token_bytes);

// A frame header in words ("allreduce #3 of 10 f32 (sum, wire f32) by ring"), or "something
// unrecognisable" when the bytes are not a frame header at all.
std::string describe_frame(const std::uint8_t* header);
void encode_frame(const CollectiveCall& call, std::uint8_t* out);

class PeerTransport {
 public:
  // One message to or from one peer. The caller fills peer, outgoing, data and bytes, hands it
  // to start() and keeps it (and its data) alive until done(). Messages between two ranks in
  // one direction travel in the order they were started.
  class Transfer {
   public:
    int peer = -1;
    bool outgoing = false;
    void* data = nullptr;
    std::size_t bytes = 0;
    bool done() const { return done_; }

   private:
    friend class PeerTransport;
    std::uint8_t header_[kFrameHeaderBytes] = {};
    std::size_t header_bytes_ = 0;  // 0 or kFrameHeaderBytes: the collective's first message
    std::size_t moved_ = 0;         // header and data bytes moved so far
    bool done_ = false;
  };

  // Listens on an ephemeral port of bind_host and publishes it; connects nothing yet.
  PeerTransport(Store& store, int rank, int size, const PeerTransportOptions& options);
  ~PeerTransport();
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // A collective opens with begin(call): its deadline starts, and the first message to and
  // from each peer carries the call's frame header, checked by the receiver. end() closes it.
  void begin(const CollectiveCall& call);
  void end();
  const CollectiveCall& call() const { return call_; }

  // Starts a message (connecting to its peer first if this is their first), moving what the
  // socket takes at once. Throws like progress().
  void start(Transfer& transfer);
  // Drives every started message until at least one more is done. Throws PeerError naming
  // the peer that closed, failed or let the deadline pass, CommError when a peer's frame
  // header shows another call; either way every connection is closed and the transport
  // refuses further use.
  void progress();
  // Drives until `transfer` is done.
  void wait(const Transfer& transfer);
  void wait(const Transfer& a, const Transfer& b);

  // After a failure the byte streams are out of step: close every connection.
  void break_links();
  bool broken() const { return broken_; }

  // Counters since construction (tests and the benchmark's account of system calls).
  struct Counters {
    std::uint64_t sends = 0, receives = 0, polls = 0, would_block = 0, connects = 0;
  };
  const Counters& counters() const { return counters_; }
  // The congestion control of the connection to `peer` ("" before it is made, or where the
  // system does not say).
  std::string congestion_control(int peer) const;

 private:
  struct Link;
  class Listener;
  Link& link(int peer);
  bool ready(int peer, Link& link);
  std::string machine_of(int peer);
  void opened(int peer, Link& link);
  void connect_to(int peer, Link& link);
  bool move_bytes(Transfer& transfer, Link& link);
  void sleep_until_ready();
  void look_for_gone_peers();
  [[noreturn]] void fail_peer(int peer, const std::string& what);
  [[noreturn]] void fail_timeout();

  int rank_;
  int size_;
  PeerTransportOptions options_;
  std::string machine_;  // the machine this rank published
  Store& store_;
  bool broken_ = false;
  CollectiveCall call_{};
  std::uint8_t header_[kFrameHeaderBytes] = {};
  std::chrono::steady_clock::time_point deadline_{};
  std::chrono::steady_clock::time_point next_gone_look_{};  // look_for_gone_peers()
  std::vector<Transfer*> active_;                           // started, not done, in start order
  std::unique_ptr<Listener> listener_;
  std::vector<std::unique_ptr<Link>> links_;  // by peer; null until connected
  std::uint64_t generation_ = 0;  // begin() calls: which collective a frame header opens
  std::uint64_t round_ = 0;       // progress() rounds: one message per stream and round
  Counters counters_;
};

}  // namespace partrain::comm
