// defines: Clock, Deadline helpers, run_until(), connect_with_retry(), read_exact(),
// write_all(), tune_socket() — blocking socket operations on Boost.Asio, each with a bound.
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

// Connects to host:port, retrying while the peer is not listening yet. Returns false when
// the deadline passes first; throws UsageError when the host does not resolve.
// buffer_bytes > 0: tune_socket() before connecting, so the window scale fits the buffers.
bool connect_with_retry(boost::asio::io_context& io, tcp::socket& socket, const std::string& host,
                        int port, Clock::time_point deadline, int buffer_bytes = 0);

// TCP_NODELAY, and send/receive buffers of at least `buffer_bytes` (never shrunk: a small
// send buffer makes every write wait for the peer's acknowledgement).
void tune_socket(tcp::socket& socket, int buffer_bytes);

// "host:port" <-> parts; IPv6 hosts are bracketed.
std::string join_host_port(const std::string& host, int port);
bool split_host_port(const std::string& text, std::string& host, int& port);

}  // namespace partrain::comm::net
