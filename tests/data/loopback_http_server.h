// defines: LoopbackHttpServer — a minimal HTTP/1.0 file server on 127.0.0.1 (Boost.Asio)
// that the download tests point libcurl at: known paths get 200 and their bytes, others 404;
// in stall mode it accepts and never answers; with a delay it answers each request that much
// later (a slow download).
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace partrain::data::test_files {

class LoopbackHttpServer {
 public:
  using Files = std::map<std::string, std::vector<std::uint8_t>>;

  explicit LoopbackHttpServer(Files files, bool stall = false,
                              std::chrono::milliseconds delay = std::chrono::milliseconds(0))
      : files_(std::move(files)),
        stall_(stall),
        delay_(delay),
        acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~LoopbackHttpServer() {
    io_.stop();
    thread_.join();
  }
  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;

  int port() const { return acceptor_.local_endpoint().port(); }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port()) + path;
  }
  int requests() const { return requests_.load(); }

 private:
  using tcp = boost::asio::ip::tcp;
  struct Connection {
    explicit Connection(boost::asio::io_context& io) : socket(io), timer(io) {}
    tcp::socket socket;
    boost::asio::steady_timer timer;
    boost::asio::streambuf request;
    std::string response;
  };

  void accept() {
    auto connection = std::make_shared<Connection>(io_);
    acceptor_.async_accept(connection->socket, [this, connection](boost::system::error_code ec) {
      if (ec) return;
      if (stall_) {
        stalled_.push_back(connection);  // kept open, never answered
      } else {
        serve(connection);
      }
      accept();
    });
  }

  void serve(const std::shared_ptr<Connection>& connection) {
    boost::asio::async_read_until(
        connection->socket, connection->request, "\r\n\r\n",
        [this, connection](boost::system::error_code ec, std::size_t) {
          if (ec) return;
          ++requests_;
          std::istream in(&connection->request);
          std::string method, path;
          in >> method >> path;
          const auto it = files_.find(path);
          if (it == files_.end()) {
            connection->response = "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n";
          } else {
            connection->response =
                "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n"
                "Content-Length: " +
                std::to_string(it->second.size()) + "\r\n\r\n";
            connection->response.append(it->second.begin(), it->second.end());
          }
          connection->timer.expires_after(delay_);
          connection->timer.async_wait([connection](boost::system::error_code) {
            boost::asio::async_write(connection->socket, boost::asio::buffer(connection->response),
                                     [connection](boost::system::error_code, std::size_t) {
                                       boost::system::error_code ignored;
                                       connection->socket.shutdown(tcp::socket::shutdown_both,
                                                                   ignored);
                                     });
          });
        });
  }

  Files files_;
  bool stall_;
  std::chrono::milliseconds delay_;
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<std::shared_ptr<Connection>> stalled_;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

}  // namespace partrain::data::test_files
