// defines: Clock, Deadline helpers, run_until(), connect_with_retry(), read_exact(),
// write_all(), tune_socket() — blocking socket operations on Boost.Asio, each with a bound —
// and a data connection's congestion control (congestion_problem(), set_congestion_control(),
// ...).
//
// Asio's synchronous calls cannot time out, so every operation here is asynchronous and the
// caller's thread drives the io_context until the operation finishes or the deadline passes;
// on timeout the operation is cancelled before returning, so buffers are free again.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <string>

namespace partrain::comm::net {

using Clock = std::chrono::steady_clock;
using boost::asio::ip::tcp;

inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + timeout;
}

// Drives io until done() is true (returns true) or the deadline passes (returns false).
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done,
               Clock::time_point deadline);

enum class IoStatus { ok, timeout, closed, error };
struct IoResult {
  IoStatus status = IoStatus::ok;
  std::string message;  // set unless ok
  bool ok() const { return status == IoStatus::ok; }
};

IoResult read_exact(boost::asio::io_context& io, tcp::socket& socket, void* data, std::size_t bytes,
                    Clock::time_point deadline);
IoResult write_all(boost::asio::io_context& io, tcp::socket& socket, const void* data,
                   std::size_t bytes, Clock::time_point deadline);

// How connect_with_retry() prepares each socket before it connects.
struct SocketTuning {
  int buffer_bytes = 0;  // > 0: tune_socket() first, so that the window scale fits the buffers
  std::string congestion = "system";  // set_congestion_control()'s request
  bool same_kernel = false;           // the peer runs on this machine's kernel
  std::string own_address;            // where this rank listens: a peer there shares its stack
  // The peer was listening before it published the address: where every address of the host
  // refuses the connection, the listener is gone (its process exited or gave up) and waiting
  // for it to come back would only wait out the deadline.
  bool listened_before_publishing = false;
};

// Connects to host:port, retrying while the peer is not listening yet. Returns false when
// the deadline passes first; throws UsageError when the host does not resolve and CommError
// when the kernel refuses a named congestion control, or (listened_before_publishing) when the
// peer refuses the connection.
bool connect_with_retry(boost::asio::io_context& io, tcp::socket& socket, const std::string& host,
                        int port, Clock::time_point deadline, const SocketTuning& tuning = {});

// TCP_NODELAY, and send/receive buffers of at least `buffer_bytes` (never shrunk: a small
// send buffer makes every write wait for the peer's acknowledgement).
void tune_socket(tcp::socket& socket, int buffer_bytes);

// Which TCP congestion control a data connection uses (Note [Congestion control on one
// machine] in timed_io.cpp): "auto" (the default) takes a loss-based one (cubic, else reno)
// where both ends run on one machine and keeps the system's between machines; "system" keeps
// the system's everywhere; any other name is that algorithm on every connection (Linux only).
inline constexpr const char* kCongestionAuto = "auto";
inline constexpr const char* kCongestionSystem = "system";

// What is wrong with how a congestion control request is written, or "" for auto, system, or
// a plain name (Linux only). Whether this kernel has and permits the name is
// congestion_refusal()'s to say, where the connections will be made.
std::string congestion_problem(const std::string& request);

// Why this kernel refuses a named request to this process ("" for auto, system, or a name it
// takes), tried on a socket of its own: a name not loaded (a privileged process loads a module
// that has it) or not permitted.
std::string congestion_refusal(const std::string& request);

// Whether a connection's two ends share one network stack, which its packets never leave: an
// end on a loopback address, or the same address at both ends. Ends in two network namespaces
// of one kernel (containers) are told apart from two machines by kernel_identity() instead.
bool same_stack(const tcp::endpoint& local, const tcp::endpoint& remote);

using NativeSocket = tcp::socket::native_handle_type;

// Sets a request congestion_problem() accepts on a socket that is open and not yet connected,
// or on a listener, whose connections inherit it: a connection keeps what the algorithm it
// started with set up (BBR turns on pacing), whatever takes over later. one_machine: both ends
// run on this machine's kernel (same_stack(), or the same kernel_identity()). Auto never fails
// (where neither cubic nor reno may be set the system's stays); a named algorithm the kernel
// refuses to this process throws CommError.
void set_congestion_control(NativeSocket socket, const std::string& request, bool one_machine);

// Sets `name` on a socket; false where the kernel refuses (or not on Linux).
bool try_congestion_control(NativeSocket socket, const std::string& name);

// The system's default congestion control for new connections, in the calling thread's
// network namespace ("" where the system does not say).
std::string system_congestion_control();

// What auto gives a connection between ranks of one machine here, read back from a socket of
// its own ("" where the system does not say).
std::string auto_congestion_control();

// The congestion control of a socket ("" where the system does not say).
std::string congestion_control_of(NativeSocket socket);

// "host:port" <-> parts; IPv6 hosts are bracketed.
std::string join_host_port(const std::string& host, int port);
bool split_host_port(const std::string& text, std::string& host, int& port);

}  // namespace partrain::comm::net
