// defines: TcpStore (client, optionally hosting the server) and TcpStoreServer — a small
// key-value server on Boost.Asio.
//
// Protocol (little-endian): the client opens with kStoreMagic, a version and its run token;
// the server answers kStoreAccept, or kStoreRefuse for a wrong token, or closes. Then each
// request is
//   u8 command | u32 key bytes | u32 value bytes | key | value
// with key and value sizes bounded (kMaxKeyBytes, kMaxValueBytes); a client that breaks the
// protocol is disconnected. get/wait poll on the client side with a growing pause.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "comm_backends/store/store.h"

namespace partrain::comm {

inline constexpr char kStoreMagic[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'E', '1'};
inline constexpr char kStoreAccept[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'O', 'K'};
// Sent, before closing, to a client whose hello was well formed but whose run token is not
// this store's: another job on the same port, which deserves to be told so.
inline constexpr char kStoreRefuse[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'N', 'O'};
inline constexpr std::uint32_t kStoreProtocolVersion = 1;
inline constexpr std::uint32_t kMaxTokenBytes = 1024;
inline constexpr std::uint32_t kMaxKeyBytes = 4096;
inline constexpr std::uint32_t kMaxValueBytes = 64u << 20;

// The server's half of the protocol as pure functions over bytes, so it can be checked
// without sockets. A false answer means: drop the connection.
inline constexpr std::size_t kStoreHelloBytes = 16;    // magic, version, token length
inline constexpr std::size_t kStoreRequestBytes = 9;   // command, key length, value length
inline constexpr std::size_t kStoreResponseBytes = 5;  // status, value length

// Checks the magic, version and token length of a hello; sets the token bytes to read next.
bool parse_store_hello(const std::uint8_t* hello, std::uint32_t& token_bytes);

struct StoreRequestHeader {
  std::uint8_t command = 0;
  std::uint32_t key_bytes = 0;
  std::uint32_t value_bytes = 0;
};
// Checks the sizes a request announces before its body is read (and allocated).
bool parse_store_request(const std::uint8_t* header, StoreRequestHeader& request);

using StoreTable = std::map<std::string, std::vector<std::uint8_t>>;
// Runs one request whose body (key then value) has arrived; `response` gets the whole answer.
bool serve_store_request(StoreTable& table, const StoreRequestHeader& request,
                         const std::vector<std::uint8_t>& body,
                         std::vector<std::uint8_t>& response);

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port) until destroyed.
  TcpStoreServer(const std::string& host, int port, const std::string& token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

  struct State;  // io context, acceptor, data; shared with pending handlers

 private:
  std::shared_ptr<State> state_;
  int port_ = 0;
  std::thread thread_;
};

class TcpStore : public Store {
 public:
  // Connects to host:port within options.timeout; with options.host_server, first starts the
  // server there (port 0 picks a free one; see port()).
  TcpStore(const std::string& host, int port, const StoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  int port() const { return port_; }

 private:
  enum class Command : std::uint8_t { set = 1, get = 2, add = 3 };
  std::vector<std::uint8_t> request(Command command, const std::string& key,
                                    const std::vector<std::uint8_t>& value);
  bool try_get(const std::string& key, std::vector<std::uint8_t>& value);

  std::unique_ptr<TcpStoreServer> server_;
  std::string endpoint_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
};

}  // namespace partrain::comm
