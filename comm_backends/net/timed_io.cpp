#include "comm_backends/net/timed_io.h"

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <thread>

#include "common/errors.h"

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
                        int port, Clock::time_point deadline, int buffer_bytes) {
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  PARTRAIN_CHECK(!ec && !endpoints.empty(), UsageError, "cannot resolve host '", host,
                 "': ", ec.message());
  const tcp::endpoint endpoint = *endpoints.begin();
  auto pause = std::chrono::milliseconds(1);
  while (Clock::now() < deadline) {
    bool done = false;
    boost::system::error_code connect_error;
    if (socket.is_open()) socket.close(ec);
    socket.open(endpoint.protocol(), ec);
    PARTRAIN_CHECK(!ec, CommError, "cannot open a socket: ", ec.message());
    if (buffer_bytes > 0) tune_socket(socket, buffer_bytes);
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
    // Not listening yet: try again shortly, backing off to keep the poll cheap.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
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
