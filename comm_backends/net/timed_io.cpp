#include "comm_backends/net/timed_io.h"

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <cctype>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#endif

#include "common/errors.h"

// Note [Congestion control on one machine]
// Ranks on one machine talk through the kernel alone: loopback inside a network namespace, a
// veth pair or a bridge between namespaces and containers. There the CPU that sends a segment
// also hands it to the receiving socket. A collective's connection carries data both ways at
// once, and a sender whose congestion window holds data back sends it later from where the
// peer's acknowledgement is taken in, on the peer's CPU; so segments of one stream are handed
// in by two CPUs and can arrive out of order. BBR, the default on some kernels, keeps its
// window near twice its measured bandwidth times its least round trip, a few microseconds
// here: about 20 segments of 64 KiB, less than a 4 MiB message, so data is held back often.
// TCP takes the reordering for loss, sends again and cuts the window, which holds back more.
// Measured on a 2-core guest (kernel 6.18, BBR its default; BENCHMARKS.md, "Congestion control
// on one machine"), a 4 MiB allreduce at W = 2:
//   * over loopback, 0.8 ms until the first reordering and mostly 1.4-1.7 ms after it, to the
//     end of the process, with the ranks pinned to CPUs of their own or not, and 12-131
//     segments sent again a run;
//   * between two network namespaces over veth, 1.8-2.4 ms, 18000-26000 segments sent again;
//   * with cubic or reno, 0.8 ms in every round either way, and nothing sent again.
//
// With no link between the ends there is no congestion to control, so `auto` sets cubic
// (Linux's usual default), or reno where cubic may not be set (without CAP_NET_ADMIN a process
// may set only what net.ipv4.tcp_allowed_congestion_control lists, reno unless an
// administrator took it out), on a connection whose ends share one network stack or one
// kernel (kernel_identity(), which each rank publishes). Between machines the system's choice
// stays, for reasons of the network that partrain does not know; comm.tcp_congestion names one for
// every connection.
//
// The choice is made before a connection is: an algorithm sets some things up when the
// connection starts and they stay when another takes over (BBR turns on pacing). Switched
// after the handshake on one side, the allreduce above took 1.1-1.3 ms over veth. So the
// connecting side sets it on its socket before connecting, knowing the peer's machine from
// the store, and under auto a listener takes the choice for one machine (its connections
// inherit it) and hands a connection from another machine the system's back once accepted.

namespace partrain::comm::net {

namespace asio = boost::asio;

bool run_until(asio::io_context& io, const std::function<bool()>& done,
               Clock::time_point deadline) {
  io.restart();
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    io.run_one_until(deadline);
    if (io.stopped()) io.restart();
  }
  return true;
}

namespace {

IoResult to_result(const boost::system::error_code& ec) {
  if (!ec) return {};
  if (ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe || ec == asio::error::connection_aborted) {
    return {IoStatus::closed, "connection closed (" + ec.message() + ")"};
  }
  return {IoStatus::error, ec.message()};
}

// Runs a started operation to completion or cancels it at the deadline.
IoResult finish(asio::io_context& io, tcp::socket& socket, bool& done,
                boost::system::error_code& ec, Clock::time_point deadline) {
  if (!run_until(
          io, [&] { return done; }, deadline)) {
    boost::system::error_code ignored;
    socket.cancel(ignored);
    run_until(
        io, [&] { return done; }, Clock::now() + std::chrono::seconds(5));
    return {IoStatus::timeout, "timed out"};
  }
  return to_result(ec);
}

}  // namespace

IoResult read_exact(asio::io_context& io, tcp::socket& socket, void* data, std::size_t bytes,
                    Clock::time_point deadline) {
  bool done = false;
  boost::system::error_code ec;
  asio::async_read(socket, asio::buffer(data, bytes),
                   [&](const boost::system::error_code& e, std::size_t) {
                     ec = e;
                     done = true;
                   });
  return finish(io, socket, done, ec, deadline);
}

IoResult write_all(asio::io_context& io, tcp::socket& socket, const void* data, std::size_t bytes,
                   Clock::time_point deadline) {
  bool done = false;
  boost::system::error_code ec;
  asio::async_write(socket, asio::buffer(data, bytes),
                    [&](const boost::system::error_code& e, std::size_t) {
                      ec = e;
                      done = true;
                    });
  return finish(io, socket, done, ec, deadline);
}

bool connect_with_retry(asio::io_context& io, tcp::socket& socket, const std::string& host,
                        int port, Clock::time_point deadline, const SocketTuning& tuning) {
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  const std::string name = host.size() >= 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  auto results = resolver.resolve(name, std::to_string(port), tcp::resolver::numeric_service, ec);
  PARTRAIN_CHECK(!ec && !results.empty(), UsageError, "cannot resolve host '", host,
                 "': ", ec ? ec.message() : "no addresses");
  // A name may resolve to several addresses (IPv6 and IPv4 for one host): each round tries
  // them all, since the peer listens on one of them only.
  std::vector<tcp::endpoint> endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  const auto own = asio::ip::make_address(tuning.own_address, ec);
  const bool own_known = !ec;
  auto pause = std::chrono::milliseconds(1);
  while (Clock::now() < deadline) {
    bool all_refused = true;
    for (const auto& endpoint : endpoints) {
      bool done = false;
      boost::system::error_code connect_error;
      if (socket.is_open()) socket.close(ec);
      socket.open(endpoint.protocol(), ec);
      if (ec) {  // e.g. no IPv6 on this host: the next address may do
        all_refused = false;
        continue;
      }
      if (tuning.buffer_bytes > 0) tune_socket(socket, tuning.buffer_bytes);
      set_congestion_control(socket.native_handle(), tuning.congestion,
                             tuning.same_kernel || endpoint.address().is_loopback() ||
                                 (own_known && endpoint.address() == own));
      socket.async_connect(endpoint, [&](const boost::system::error_code& e) {
        connect_error = e;
        done = true;
      });
      if (!run_until(
              io, [&] { return done; }, deadline)) {
        socket.close(ec);
        run_until(
            io, [&] { return done; }, Clock::now() + std::chrono::seconds(5));
        return false;
      }
      if (!connect_error) return true;
      all_refused &= connect_error == asio::error::connection_refused;
    }
    PARTRAIN_CHECK(!(all_refused && tuning.listened_before_publishing), CommError,
                   join_host_port(name, port),
                   " refused the connection: the listener it published is gone (its process "
                   "exited or failed, or a firewall rejects the port)");
    // Not listening yet: try again shortly, backing off to keep the poll cheap.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  if (socket.is_open()) socket.close(ec);
  return false;
}

void tune_socket(tcp::socket& socket, int buffer_bytes) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  asio::socket_base::send_buffer_size send_size;
  socket.get_option(send_size, ec);
  if (!ec && send_size.value() < buffer_bytes) {
    socket.set_option(asio::socket_base::send_buffer_size(buffer_bytes), ec);
  }
  asio::socket_base::receive_buffer_size receive_size;
  socket.get_option(receive_size, ec);
  if (!ec && receive_size.value() < buffer_bytes) {
    socket.set_option(asio::socket_base::receive_buffer_size(buffer_bytes), ec);
  }
}

namespace {

#if defined(__linux__)
// 0, or the errno of the refusal.
int set_or_errno(NativeSocket socket, const std::string& name) {
  const int rc = ::setsockopt(socket, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                              static_cast<socklen_t>(name.size()));
  return rc == 0 ? 0 : errno;
}

// Why the kernel refused `name` (errno `error`), in words.
std::string refusal(const std::string& name, int error) {
  std::string why = "'" + name + "' refused by this kernel: " + std::strerror(error);
  if (error == EPERM) {
    why += " (without CAP_NET_ADMIN only what net.ipv4.tcp_allowed_congestion_control lists)";
  } else if (error == ENOENT) {
    std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
    std::string available;
    std::getline(in, available);
    if (!available.empty()) why += " (it has: " + available + ")";
  }
  return why;
}
#endif

}  // namespace

std::string congestion_problem(const std::string& request) {
  if (request == kCongestionAuto || request == kCongestionSystem) return "";
  // Kernel names are short (TCP_CA_NAME_MAX is 16 with its terminator) and plain.
  bool plain = !request.empty() && request.size() < 16;
  for (const char c : request) {
    plain = plain && (std::islower(static_cast<unsigned char>(c)) ||
                      std::isdigit(static_cast<unsigned char>(c)) || c == '_');
  }
  if (!plain) {
    return "'" + request +
           "' is not auto, system or the name of a TCP congestion control (cubic, reno, bbr, ...)";
  }
#if defined(__linux__)
  return "";
#else
  return "'" + request + "': only Linux lets a connection choose its congestion control (use " +
         kCongestionAuto + " or " + kCongestionSystem + ")";
#endif
}

std::string congestion_refusal(const std::string& request) {
#if defined(__linux__)
  if (request == kCongestionAuto || request == kCongestionSystem) return "";
  const NativeSocket probe = ::socket(AF_INET, SOCK_STREAM, 0);
  if (probe < 0) return "";  // the connections will say
  const int error = set_or_errno(probe, request);
  ::close(probe);
  return error == 0 ? "" : refusal(request, error);
#else
  (void)request;
  return "";
#endif
}

bool same_stack(const tcp::endpoint& local, const tcp::endpoint& remote) {
  return local.address().is_loopback() || remote.address().is_loopback() ||
         local.address() == remote.address();
}

bool try_congestion_control(NativeSocket socket, const std::string& name) {
#if defined(__linux__)
  return set_or_errno(socket, name) == 0;
#else
  (void)socket;
  (void)name;
  return false;
#endif
}

void set_congestion_control(NativeSocket socket, const std::string& request, bool one_machine) {
#if defined(__linux__)
  if (request == kCongestionAuto) {
    if (!one_machine) return;
    for (const char* name : {"cubic", "reno"}) {
      if (try_congestion_control(socket, name)) return;
    }
  } else if (request != kCongestionSystem) {
    const int error = set_or_errno(socket, request);
    if (error != 0) throw CommError("comm.tcp_congestion " + refusal(request, error));
  }
#else
  (void)socket;
  (void)request;
  (void)one_machine;
#endif
}

namespace {

// What a new socket of this thread's network namespace has, after auto's choice for one
// machine when `with_auto`. Sockets answer where /proc/sys may be hidden (a container).
std::string probe_congestion_control(bool with_auto) {
#if defined(__linux__)
  const NativeSocket probe = ::socket(AF_INET, SOCK_STREAM, 0);
  if (probe < 0) return "";
  if (with_auto) set_congestion_control(probe, kCongestionAuto, true);
  std::string name = congestion_control_of(probe);
  ::close(probe);
  return name;
#else
  (void)with_auto;
  return "";
#endif
}

}  // namespace

std::string system_congestion_control() { return probe_congestion_control(false); }

std::string auto_congestion_control() { return probe_congestion_control(true); }

std::string congestion_control_of(NativeSocket socket) {
#if defined(__linux__)
  char name[32] = {};
  socklen_t size = sizeof name;
  if (::getsockopt(socket, IPPROTO_TCP, TCP_CONGESTION, name, &size) != 0) return "";
  return std::string(name, ::strnlen(name, std::min<std::size_t>(size, sizeof name)));
#else
  (void)socket;
  return "";
#endif
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool split_host_port(const std::string& text, std::string& host, int& port) {
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return false;
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) return false;
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host.empty() || port_text.empty() || port_text.size() > 5) return false;
  port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + (c - '0');
  }
  return port <= 65535;
}

}  // namespace partrain::comm::net
