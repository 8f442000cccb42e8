#include "comm_backends/peer/peer_transport.h"

// Note [Peer transport]
// Connections. Each rank but 0 listens on an ephemeral port of bind_host and publishes
// "host:port" under PREFIX/addr/RANK, and every rank, rank 0 too, its machine there
// (PeerAddress), by which each connection's congestion control is chosen (Note [Congestion
// control on one machine] in net/timed_io.cpp). A pair of ranks shares one TCP connection
// (full duplex), made the first time either starts a message to the other: the lower rank
// connects to the higher one and opens with a handshake (kPeerMagic, protocol version, rank,
// world size, run token); the higher rank's listener thread checks every field — a rank below
// its own, of this world, with this run's token, not yet connected — and answers kPeerAccept;
// anything else (garbage, a wrong token, a stray rank, a connection that says nothing) is
// closed, at once or when its handshake's bound (the collective timeout) passes. The listener
// closes once every lower rank has connected: none can come after. A connection that passed its
// handshake leaves the listener's io_context (hand_over()), so its messages never wake that thread.
// Connecting to a higher rank waits only for that rank's listener thread, never for the rank
// itself; messages to and from a lower rank wait, without holding the thread, until its
// connection is in. So a rank that waits for a connection still moves its other messages, and
// no order of first messages can deadlock.
//
// Messages. The data path is one thread and non-blocking sockets: start() moves what the
// kernel takes at once; progress() tries every started message (the first of each peer and
// direction: a stream keeps messages in order), and when none moved, tries again for a short
// bounded spin (options.spin; the core is yielded between tries, so that a rank waiting for
// this core runs at once) and then sleeps in poll() until a socket is ready or the deadline
// passes. No hand-off between threads, no wake-up of another thread, one system call per
// message in the common case: what a message costs is the kernel's copy and, when the peer is
// not there yet, one poll.
//
// Frame headers. The first message to each peer in a collective starts with a 32-byte frame
// header (the CollectiveCall in little-endian: magic, kind, dtype, wire, op, root, sequence,
// count, algorithm), sent in the same system call as the data; the receiver checks it against
// its own call as soon as its 32 bytes are in, so ranks that disagree fail with both calls
// named before any data is taken.

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#if defined(_WIN32)
#include <winsock2.h>
#else
#include <poll.h>
#include <pthread.h>
#include <unistd.h>
#endif

#include "comm_backends/net/timed_io.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
#include "common/errors.h"

namespace partrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t kFrameMagic = 0x46435450;  // "PTCF"

bool closed_by_peer(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

}  // namespace

std::string encode_peer_address(const PeerAddress& address) {
  return address.listen + "\n" + address.machine;
}

PeerAddress decode_peer_address(const std::string& text) {
  const auto end = text.find('\n');
  if (end == std::string::npos) return {text, ""};
  return {text.substr(0, end), text.substr(end + 1)};
}

std::string peer_address_key(const std::string& key_prefix, int rank) {
  return key_prefix + "addr/" + std::to_string(rank);
}

std::string peer_gone_key(const std::string& key_prefix, int rank) {
  return key_prefix + "gone/" + std::to_string(rank);
}

std::string encode_peer_handshake(int rank, int world, const std::string& token) {
  std::string message(kPeerHandshakeBytes, '\0');
  std::memcpy(message.data(), kPeerMagic, 8);
  put_le<std::uint32_t>(message.data() + 8, kPeerProtocolVersion);
  put_le<std::uint32_t>(message.data() + 12, static_cast<std::uint32_t>(rank));
  put_le<std::uint32_t>(message.data() + 16, static_cast<std::uint32_t>(world));
  put_le<std::uint32_t>(message.data() + 20, static_cast<std::uint32_t>(token.size()));
  return message + token;
}

int check_peer_handshake(const char* handshake, int acceptor, int world, std::size_t token_bytes) {
  if (std::memcmp(handshake, kPeerMagic, 8) != 0 ||
      get_le<std::uint32_t>(handshake + 8) != kPeerProtocolVersion ||
      get_le<std::uint32_t>(handshake + 16) != static_cast<std::uint32_t>(world) ||
      get_le<std::uint32_t>(handshake + 20) != token_bytes) {
    return -1;
  }
  const std::uint32_t rank = get_le<std::uint32_t>(handshake + 12);
  return rank < static_cast<std::uint32_t>(acceptor) ? static_cast<int>(rank) : -1;
}

void encode_frame(const CollectiveCall& call, std::uint8_t* out) {
  std::memset(out, 0, kFrameHeaderBytes);
  put_le<std::uint32_t>(out, kFrameMagic);
  out[4] = call.kind;
  out[5] = call.dtype;
  out[6] = call.wire;
  out[7] = call.op;
  put_le(out + 8, static_cast<std::uint32_t>(call.root));
  put_le(out + 12, call.sequence);
  put_le(out + 20, call.counts_elements() ? call.elements : call.bytes);
  out[28] = call.algorithm;
}

std::string describe_frame(const std::uint8_t* header) {
  if (get_le<std::uint32_t>(header) != kFrameMagic) return "something unrecognisable";
  CollectiveCall theirs;
  theirs.kind = header[4];
  theirs.dtype = header[5];
  theirs.wire = header[6];
  theirs.op = header[7];
  theirs.root = static_cast<std::int32_t>(get_le<std::uint32_t>(header + 8));
  theirs.sequence = get_le<std::uint64_t>(header + 12);
  (theirs.counts_elements() ? theirs.elements : theirs.bytes) = get_le<std::uint64_t>(header + 20);
  theirs.algorithm = header[28];
  return theirs.describe();
}

// ---- connections ------------------------------------------------------------------------

struct PeerTransport::Link {
  std::unique_ptr<asio::io_context> io;  // the link's own (none where an accepted socket
                                         // stayed in the listener's); declared first: outlives
  std::unique_ptr<tcp::socket> socket;   // the socket
  std::uint64_t sent_in = 0;             // the collective whose frame header went out last
  std::uint64_t received_in = 0;         // the collective whose frame header came in last
  std::uint64_t busy_round = 0;  // progress(): the round a message of this link was tried in
  bool busy_out = false, busy_in = false;
};

// The accepting half, on a thread of its own: every incoming connection is a candidate until
// its handshake proves it is a lower rank of this run.
class PeerTransport::Listener {
 public:
  // A connection whose handshake passed, with the io_context its socket belongs to (null
  // where it stayed in the listener's).
  struct Accepted {
    std::unique_ptr<asio::io_context> io;  // declared first: outlives the socket
    std::unique_ptr<tcp::socket> socket;
  };

  Listener(int rank, int world, const PeerTransportOptions& options)
      : acceptor_(io_),
        rank_(rank),
        world_(world),
        token_(options.token),
        bound_(options.timeout),
        accepted_(rank) {
    error_code ec;
    const auto address = asio::ip::make_address(options.bind_host, ec);
    PARTRAIN_CHECK(!ec, UsageError, options.name, ": bind host '", options.bind_host,
                   "' is not an IP address of this machine");
    const tcp::endpoint endpoint(address, 0);
    acceptor_.open(endpoint.protocol(), ec);
    // Buffer sizes set on the listener carry over to accepted sockets before the handshake,
    // when the TCP window scale is fixed.
    if (!ec) {
      acceptor_.set_option(asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), ec);
      acceptor_.set_option(asio::socket_base::send_buffer_size(options.socket_buffer_bytes), ec);
      ec.clear();
      // So does the congestion control, which a connection best starts with (Note
      // [Congestion control on one machine] in net/timed_io.cpp). Under auto a listener takes
      // the choice for one machine on any address where the system's can be restored: a
      // connection from another machine gets the system's back when accepted (ready()).
      system_congestion_ = net::system_congestion_control();
      net::set_congestion_control(acceptor_.native_handle(), options.tcp_congestion,
                                  address.is_loopback() || !system_congestion_.empty());
      congestion_ = net::congestion_control_of(acceptor_.native_handle());
    }
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    PARTRAIN_CHECK(!ec, CommError, options.name, ": cannot listen on ", options.bind_host, ": ",
                   ec.message());
    port_ = acceptor_.local_endpoint().port();
    accept_next();
    thread_ = std::thread([this] {
#if defined(__linux__)
      // Named for `top -H` and for the test that counts this thread's wake-ups.
      pthread_setname_np(pthread_self(), "partrain-listen");
#endif
      io_.run();
    });
  }

  ~Listener() {
    asio::post(io_, [this] { close_all(); });
    thread_.join();
  }

  int port() const { return port_; }
  // The congestion control its connections start with, unless a route names another, and
  // the system's default, read once when it opened ("" where the system does not say).
  const std::string& congestion() const { return congestion_; }
  const std::string& system_congestion() const { return system_congestion_; }

  // The connection of lower rank `peer` once its handshake passed (its socket null until
  // then); never waits.
  Accepted take(int peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(accepted_[peer]);
  }

  int refused() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return refused_;
  }

 private:
  struct Candidate {
    Candidate(tcp::socket s, asio::io_context& io) : socket(std::move(s)), timer(io) {}
    tcp::socket socket;
    asio::steady_timer timer;  // the bound on its handshake
    char header[kPeerHandshakeBytes] = {};
    std::string token;
    int rank = -1;
  };

  void accept_next() {
    acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        auto candidate = std::make_shared<Candidate>(std::move(socket), io_);
        candidates_.push_back(candidate);
        candidate->timer.expires_after(bound_);
        candidate->timer.async_wait([this, candidate](const error_code& e) {
          if (!e) refuse(candidate);
        });
        read_handshake(candidate);
      }
      accept_next();
    });
  }

  void read_handshake(const std::shared_ptr<Candidate>& c) {
    asio::async_read(c->socket, asio::buffer(c->header, kPeerHandshakeBytes),
                     [this, c](const error_code& ec, std::size_t) {
                       if (ec) return refuse(c);
                       c->rank = check_peer_handshake(c->header, rank_, world_, token_.size());
                       if (c->rank < 0) return refuse(c);
                       c->token.resize(token_.size());
                       asio::async_read(c->socket, asio::buffer(c->token.data(), c->token.size()),
                                        [this, c](const error_code& e, std::size_t) {
                                          if (e || c->token != token_) return refuse(c);
                                          answer(c);
                                        });
                     });
  }

  void answer(const std::shared_ptr<Candidate>& c) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (accepted_[c->rank].socket != nullptr || taken_[c->rank]) return refuse_locked(c);
    }
    asio::async_write(c->socket, asio::buffer(kPeerAccept, 8),
                      [this, c](const error_code& ec, std::size_t) {
                        if (ec) return refuse(c);
                        c->timer.cancel();
                        forget(c);
                        std::lock_guard<std::mutex> lock(mutex_);
                        if (accepted_[c->rank].socket != nullptr || taken_[c->rank]) {
                          return refuse_locked(c);
                        }
                        Accepted moved = hand_over(c->socket);
                        if (moved.socket == nullptr) {
                          ++refused_;
                          return;
                        }
                        accepted_[c->rank] = std::move(moved);
                        taken_[c->rank] = true;
                        // Every lower rank is in: nobody else may connect.
                        if (++connected_ == rank_) close_all();
                      });
  }

  // Past its handshake a connection leaves this io_context for one of its own that no thread
  // runs, as a connecting side's has. Left here, every message that arrived on it would wake
  // this thread (epoll reports each edge on a registered socket while the listener waits for
  // other lower ranks): a context switch per message, on a host whose cores are all busy
  // with ranks. Where a socket cannot leave its context (Windows before 8.1) it stays: there
  // the blocking-free calls of the data path post nothing to wake anyone.
  static Accepted hand_over(tcp::socket& socket) {
    const auto stays = [&socket] {
      Accepted kept;
      kept.socket = std::make_unique<tcp::socket>(std::move(socket));
      return kept;
    };
    error_code ec;
    const auto protocol = socket.local_endpoint(ec).protocol();
    if (ec) return stays();
    auto handle = socket.release(ec);
    if (ec) return stays();
    Accepted moved;
    moved.io = std::make_unique<asio::io_context>();
    moved.socket = std::make_unique<tcp::socket>(*moved.io);
    moved.socket->assign(protocol, handle, ec);
    if (ec) {  // the new context would not take it: the connection is refused
#if defined(_WIN32)
      ::closesocket(handle);
#else
      ::close(handle);
#endif
      moved.socket.reset();
    }
    return moved;
  }

  void forget(const std::shared_ptr<Candidate>& c) {
    for (auto it = candidates_.begin(); it != candidates_.end(); ++it) {
      if (*it == c) {
        candidates_.erase(it);
        return;
      }
    }
  }

  void refuse(const std::shared_ptr<Candidate>& c) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_locked(c);
  }

  void refuse_locked(const std::shared_ptr<Candidate>& c) {
    error_code ignored;
    if (c->socket.is_open()) ++refused_;
    c->socket.close(ignored);
    c->timer.cancel();
    forget(c);
  }

  void close_all() {
    error_code ignored;
    acceptor_.close(ignored);
    for (auto& c : candidates_) {
      c->socket.close(ignored);
      c->timer.cancel();
    }
    candidates_.clear();
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  const int rank_;
  const int world_;
  const std::string token_;
  const std::chrono::milliseconds bound_;
  int port_ = 0;
  std::string congestion_, system_congestion_;
  std::vector<std::shared_ptr<Candidate>> candidates_;  // the io thread's alone
  int connected_ = 0;                                   // the io thread's alone
  mutable std::mutex mutex_;
  std::vector<Accepted> accepted_;  // by lower rank, until taken
  std::vector<bool> taken_ = std::vector<bool>(accepted_.size(), false);
  int refused_ = 0;
  std::thread thread_;
};

PeerTransport::PeerTransport(Store& store, int rank, int size, const PeerTransportOptions& options)
    : rank_(rank), size_(size), options_(options), store_(store) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, options.name, ": rank ", rank,
                 " is outside a world of ", size);
  PARTRAIN_CHECK(options.token.size() <= kPeerMaxTokenBytes, UsageError, options.name,
                 ": run token longer than ", kPeerMaxTokenBytes, " bytes");
  std::string congestion = net::congestion_problem(options.tcp_congestion);
  if (congestion.empty()) congestion = net::congestion_refusal(options.tcp_congestion);
  PARTRAIN_CHECK(congestion.empty(), UsageError, options.name, ": comm.tcp_congestion ",
                 congestion);
  links_.resize(size);
  machine_ = options.machine.empty() ? kernel_identity() : options.machine;
  // Rank 0 listens for no one but publishes its machine all the same: the ranks it connects
  // to read it there when they accept (machine_of()).
  PeerAddress mine{"", machine_};
  if (rank > 0) {
    listener_ = std::make_unique<Listener>(rank, size, options);
    mine.listen = net::join_host_port(options.bind_host, listener_->port());
  }
  const std::string text = encode_peer_address(mine);
  store.set(peer_address_key(options.key_prefix, rank),
            std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::string PeerTransport::congestion_control(int peer) const {
  if (peer < 0 || peer >= size_ || links_[peer] == nullptr || links_[peer]->socket == nullptr) {
    return "";
  }
  return net::congestion_control_of(links_[peer]->socket->native_handle());
}

PeerTransport::~PeerTransport() {
  // Going while unwinding from an error: a higher rank may wait for this one to connect, which
  // it never will. So too where a collective's failure broke the transport: the ranks it talked
  // to see that for themselves, but not one it had yet to connect to (with three ranks, rank 0
  // lost rank 2 before it connected to rank 1, which waited on). The store outlives the
  // transport. Briefly: a store that does not answer (its server frozen) must not hold the exit;
  // where the store is gone too, the waiting rank finds that instead.
  if (std::uncaught_exceptions() > 0) {
    try_set(store_, peer_gone_key(options_.key_prefix, rank_), {1}, kPeerGoneSetBound);
  }
  // A socket the listener accepted may still belong to its io_context: it closes first.
  links_.clear();
  listener_.reset();
}

// A link to a higher rank is made here and now: only that rank's listener thread takes part,
// so nothing this rank still owes anyone can hold it up. A link to a lower rank is whatever
// its connection has become: until the listener has it, messages on it wait (ready()).
PeerTransport::Link& PeerTransport::link(int peer) {
  PARTRAIN_CHECK(peer >= 0 && peer < size_ && peer != rank_, Error, options_.name,
                 ": no link from rank ", rank_, " to rank ", peer);
  if (links_[peer] != nullptr) return *links_[peer];
  links_[peer] = std::make_unique<Link>();
  Link& made = *links_[peer];
  if (peer > rank_) {
    connect_to(peer, made);
    opened(peer, made);
  } else {
    ready(peer, made);
  }
  return made;
}

// Whether a lower rank's connection has come (taking it from the listener if it has).
bool PeerTransport::ready(int peer, Link& l) {
  if (l.socket != nullptr) return true;
  Listener::Accepted accepted = listener_->take(peer);
  if (accepted.socket == nullptr) return false;
  l.io = std::move(accepted.io);
  l.socket = std::move(accepted.socket);
  net::tune_socket(*l.socket, options_.socket_buffer_bytes);
  // Under auto the listener gave its connections the choice for one machine as they were
  // made; one from another machine gets the system's back, unless a route chose for it.
  // Switching late costs that connection nothing that stays: only what an algorithm sets up
  // at the start does (Note [Congestion control on one machine]). Where the kernel refuses,
  // the listener's choice stays.
  error_code local_error, remote_error;
  const auto local = l.socket->local_endpoint(local_error);
  const auto remote = l.socket->remote_endpoint(remote_error);
  if (options_.tcp_congestion == net::kCongestionAuto && !local_error && !remote_error &&
      !net::same_stack(local, remote) &&
      net::congestion_control_of(l.socket->native_handle()) == listener_->congestion() &&
      (machine_.empty() || machine_of(peer) != machine_)) {
    const std::string& system = listener_->system_congestion();
    if (!system.empty() && system != listener_->congestion()) {
      net::try_congestion_control(l.socket->native_handle(), system);
    }
  }
  opened(peer, l);
  return true;
}

void PeerTransport::opened(int peer, Link& l) {
  error_code ec;
  l.socket->non_blocking(true, ec);
  PARTRAIN_CHECK(!ec, CommError, options_.name, ": cannot make the connection to rank ", peer,
                 " non-blocking: ", ec.message());
  ++counters_.connects;
}

// The machine a lower rank published: it did so before it connected to anyone.
std::string PeerTransport::machine_of(int peer) {
  std::vector<std::uint8_t> address;
  try {
    address = store_.get(peer_address_key(options_.key_prefix, peer));
  } catch (const CommError& e) {
    fail_peer(peer, "rank " + std::to_string(peer) + " did not publish its address: " + e.what());
  }
  return decode_peer_address(std::string(address.begin(), address.end())).machine;
}

// The connecting half: the peer's address from the store, the handshake, its answer. The
// socket belongs to a short-lived io_context of its own: past the handshake only blocking-free
// system calls touch it, which need none.
void PeerTransport::connect_to(int peer, Link& link) {
  std::vector<std::uint8_t> address;
  try {
    address = store_.get(peer_address_key(options_.key_prefix, peer));
  } catch (const CommError& e) {
    fail_peer(peer, "rank " + std::to_string(peer) + " did not publish its address: " + e.what());
  }
  std::string host;
  int port = 0;
  const PeerAddress published = decode_peer_address(std::string(address.begin(), address.end()));
  const std::string& text = published.listen;
  PARTRAIN_CHECK(net::split_host_port(text, host, port), CommError, options_.name, ": rank ", peer,
                 " published a bad address '", text, "'");
  link.io = std::make_unique<asio::io_context>();
  asio::io_context& io = *link.io;
  link.socket = std::make_unique<tcp::socket>(io);
  net::SocketTuning tuning;
  tuning.buffer_bytes = options_.socket_buffer_bytes;
  tuning.congestion = options_.tcp_congestion;
  tuning.own_address = options_.bind_host;
  tuning.same_kernel = !machine_.empty() && published.machine == machine_;
  tuning.listened_before_publishing = true;  // PeerTransport's constructor: listen, then publish
  bool connected = false;
  try {
    connected = net::connect_with_retry(io, *link.socket, host, port, deadline_, tuning);
  } catch (const CommError& e) {  // a named congestion control refused, or the rank is gone
    fail_peer(peer, "cannot connect to rank " + std::to_string(peer) + ": " + e.what());
  }
  if (!connected) {
    fail_peer(peer, "could not connect to rank " + std::to_string(peer) + " at " + text +
                        " within the timeout");
  }
  const std::string hello = encode_peer_handshake(rank_, size_, options_.token);
  auto result = net::write_all(io, *link.socket, hello.data(), hello.size(), deadline_);
  char answer[8] = {};
  if (result.ok()) result = net::read_exact(io, *link.socket, answer, 8, deadline_);
  // A listener closes a connection it refuses (another run's token) without a word, and so does
  // one whose rank is leaving: its accept queue is reset as it closes. A rank that leaves while
  // unwinding says so (peer_gone_key()) before its listener closes, so the store tells the two
  // apart, as connect_with_retry() tells a listener already gone.
  if (!result.ok() && result.status == net::IoStatus::closed &&
      try_get(store_, peer_gone_key(options_.key_prefix, peer), kPeerGoneSetBound)) {
    fail_peer(peer, "cannot connect to rank " + std::to_string(peer) + ": " + text +
                        " closed the connection during our handshake: that rank is leaving (its "
                        "process exited or failed): " +
                        result.message);
  }
  if (!result.ok() || std::memcmp(answer, kPeerAccept, 8) != 0) {
    fail_peer(peer, "rank " + std::to_string(peer) + " at " + text +
                        " refused our handshake (another run, or a different token?): " +
                        (result.ok() ? "bad answer" : result.message));
  }
}

// ---- messages ---------------------------------------------------------------------------

void PeerTransport::begin(const CollectiveCall& call) {
  PARTRAIN_CHECK(!broken_, CommError, options_.name,
                 ": broken by an earlier failure; create a new communicator");
  call_ = call;
  encode_frame(call_, header_);
  ++generation_;
  active_.clear();
  deadline_ = Clock::now() + options_.timeout;
  next_gone_look_ = Clock::now() + kPeerGoneLookEvery;
}

void PeerTransport::end() {
  PARTRAIN_CHECK(active_.empty(), Error, options_.name, ": ", call_.describe(),
                 " ended with messages still in flight");
}

void PeerTransport::start(Transfer& t) {
  Link& l = link(t.peer);
  t.moved_ = 0;
  t.done_ = false;
  t.header_bytes_ = 0;
  std::uint64_t& framed = t.outgoing ? l.sent_in : l.received_in;
  if (framed != generation_) {
    framed = generation_;
    t.header_bytes_ = kFrameHeaderBytes;
    if (t.outgoing) std::memcpy(t.header_, header_, kFrameHeaderBytes);
  }
  if (t.header_bytes_ + t.bytes == 0) {
    t.done_ = true;
    return;
  }
  // The first message of its stream moves at once: a small one is then already gone.
  bool first = true;
  for (const Transfer* other : active_) {
    first &= !(other->peer == t.peer && other->outgoing == t.outgoing);
  }
  active_.push_back(&t);
  if (first && l.socket != nullptr) move_bytes(t, l);
  if (t.done_) std::erase(active_, &t);
}

// One non-blocking system call for the transfer; true when bytes moved.
bool PeerTransport::move_bytes(Transfer& t, Link& l) {
  const std::size_t total = t.header_bytes_ + t.bytes;
  std::array<asio::mutable_buffer, 2> parts;
  std::size_t n = 0;
  if (t.moved_ < t.header_bytes_) {
    parts[n++] = asio::buffer(t.header_ + t.moved_, t.header_bytes_ - t.moved_);
  }
  const std::size_t data_done = t.moved_ > t.header_bytes_ ? t.moved_ - t.header_bytes_ : 0;
  if (t.bytes > data_done) {
    parts[n++] = asio::buffer(static_cast<std::uint8_t*>(t.data) + data_done, t.bytes - data_done);
  }
  error_code ec;
  std::size_t moved = 0;
  if (t.outgoing) {
    ++counters_.sends;
    moved = n == 1 ? l.socket->send(asio::buffer(parts[0]), 0, ec)
                   : l.socket->send(std::array<asio::const_buffer, 2>{parts[0], parts[1]}, 0, ec);
  } else {
    ++counters_.receives;
    moved =
        n == 1 ? l.socket->receive(asio::buffer(parts[0]), 0, ec) : l.socket->receive(parts, 0, ec);
  }
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    ++counters_.would_block;
    return false;
  }
  if (ec || (!t.outgoing && moved == 0)) {
    const bool closed = !ec || closed_by_peer(ec);
    fail_peer(t.peer,
              "rank " + std::to_string(t.peer) +
                  (closed ? " closed its connection (it exited or failed)" : " connection failed") +
                  (t.outgoing ? " while sending to it" : " while receiving from it") + " during " +
                  call_.describe() + (ec ? ": " + ec.message() : ""));
  }
  const bool had_header = t.moved_ >= t.header_bytes_;
  t.moved_ += moved;
  if (!t.outgoing && !had_header && t.moved_ >= t.header_bytes_ &&
      std::memcmp(t.header_, header_, kFrameHeaderBytes) != 0) {
    break_links();
    throw CommError(options_.name + ": ranks disagree: rank " + std::to_string(t.peer) +
                    " called " + describe_frame(t.header_) + " while rank " +
                    std::to_string(rank_) + " called " + call_.describe());
  }
  if (t.moved_ == total) t.done_ = true;
  return moved > 0;
}

void PeerTransport::progress() {
  std::size_t spins = 0;
  const auto spin_until = Clock::now() + options_.spin;
  for (;;) {
    PARTRAIN_CHECK(!active_.empty(), Error, options_.name, ": progress() with nothing started");
    // The first started message of each stream (peer and direction) is the one that may move.
    ++round_;
    bool moved = false, finished = false;
    for (Transfer* t : active_) {
      Link& l = *links_[t->peer];
      if (l.busy_round != round_) {
        l.busy_round = round_;
        l.busy_out = l.busy_in = false;
      }
      bool& busy = t->outgoing ? l.busy_out : l.busy_in;
      if (busy) continue;
      busy = true;
      if (!ready(t->peer, l)) continue;
      moved |= move_bytes(*t, l);
      finished |= t->done_;
    }
    if (finished) {
      std::erase_if(active_, [](const Transfer* t) { return t->done_; });
      return;
    }
    if (moved) continue;
    const auto now = Clock::now();
    if (now >= deadline_) fail_timeout();
    if (now >= next_gone_look_) look_for_gone_peers();
    // The spin yields the core between its looks: a peer the scheduler put on this very core
    // runs at once, instead of after the spin (it costs a system call that returns at once
    // when nothing else wants the core).
    if (options_.spin.count() > 0 && ((++spins & 15) != 0 || Clock::now() < spin_until)) {
      std::this_thread::yield();
      continue;
    }
    sleep_until_ready();
  }
}

void PeerTransport::wait(const Transfer& transfer) {
  while (!transfer.done()) progress();
}

void PeerTransport::wait(const Transfer& a, const Transfer& b) {
  while (!a.done() || !b.done()) progress();
}

// Sleeps in poll() until a socket of a message that may move is ready, or the deadline.
void PeerTransport::sleep_until_ready() {
#if defined(_WIN32)
  using PollEntry = WSAPOLLFD;
#else
  using PollEntry = pollfd;
#endif
  std::vector<PollEntry> entries;
  bool connecting = false;  // a lower rank's connection still to come: look again soon
  ++round_;
  for (Transfer* t : active_) {
    Link& l = *links_[t->peer];
    if (l.busy_round != round_) {
      l.busy_round = round_;
      l.busy_out = l.busy_in = false;
    }
    bool& busy = t->outgoing ? l.busy_out : l.busy_in;
    if (busy) continue;
    busy = true;
    if (l.socket == nullptr) {
      connecting = true;
      continue;
    }
    PollEntry entry{};
    entry.fd = l.socket->native_handle();
    entry.events = t->outgoing ? POLLOUT : POLLIN;
    entries.push_back(entry);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  // Whole milliseconds, rounded up, at most 100 ms a round (1 ms while a connection is to
  // come): the loop above re-checks.
  const int wait_ms =
      static_cast<int>(std::clamp<std::int64_t>(left.count() + 1, 0, connecting ? 1 : 100));
  ++counters_.polls;
  if (entries.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    return;
  }
#if defined(_WIN32)
  WSAPoll(entries.data(), static_cast<ULONG>(entries.size()), wait_ms);
#else
  ::poll(entries.data(), static_cast<nfds_t>(entries.size()), wait_ms);
#endif
}

void PeerTransport::fail_peer(int peer, const std::string& what) {
  break_links();
  throw PeerError(peer, options_.name + ": " + what);
}

// A lower rank still to connect after a while may be gone (peer_gone_key()); or the store is,
// with the rank that served it. One look a kPeerGoneLookEvery, and only while some connection
// is still to come: a collective that merely waits on data costs the store nothing.
void PeerTransport::look_for_gone_peers() {
  next_gone_look_ = Clock::now() + kPeerGoneLookEvery;
  for (const Transfer* t : active_) {
    if (links_[t->peer]->socket != nullptr) continue;
    bool gone = false;
    try {
      gone = store_.check({peer_gone_key(options_.key_prefix, t->peer)});
    } catch (const CommError& e) {
      // Rank 0 may serve the store: waiting for its connection, this rank knows it has not
      // finished, so the store gone is rank 0 gone. Any other rank's store going says nothing
      // of the rank awaited (rank 0 may have ended well): the deadline decides.
      if (t->peer != 0) {
        next_gone_look_ = Clock::time_point::max();
        return;
      }
      fail_peer(t->peer, "rank 0 has not connected during " + call_.describe() +
                             ", and the store cannot be reached either (" + e.what() + ")");
    }
    if (gone) {
      fail_peer(t->peer, "rank " + std::to_string(t->peer) + " left before it connected, during " +
                             call_.describe() + ": it failed" + kItsOwnOutputSaysWhy);
    }
  }
}

// The deadline passed: name the peer we wait for, one we still receive from first.
void PeerTransport::fail_timeout() {
  const Transfer* blocked = nullptr;
  for (const Transfer* t : active_) {
    if (!t->outgoing) {
      blocked = t;
      break;
    }
    if (blocked == nullptr) blocked = t;
  }
  const int peer = blocked->peer;
  if (links_[peer]->socket == nullptr) {
    const int refused = listener_->refused();
    fail_peer(peer, "rank " + std::to_string(peer) + " did not connect within " +
                        std::to_string(options_.timeout.count()) + " ms during " +
                        call_.describe() +
                        (refused ? " (refused " + std::to_string(refused) + " other connections)"
                                 : std::string()));
  }
  fail_peer(peer, "rank " + std::to_string(peer) +
                      (blocked->outgoing ? " stopped taking our data" : " sent nothing") + " for " +
                      std::to_string(options_.timeout.count()) + " ms during " + call_.describe() +
                      " (dead, hung, or not calling the same collective)");
}

void PeerTransport::break_links() {
  broken_ = true;
  active_.clear();
  error_code ignored;
  for (auto& l : links_) {
    if (l != nullptr && l->socket != nullptr) l->socket->close(ignored);
  }
}

}  // namespace partrain::comm
