#include "comm_backends/store/tcp_store.h"

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "comm_backends/net/timed_io.h"
#include "common/byte_codec.h"
#include "common/errors.h"

namespace partrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::Clock;

namespace {

constexpr std::size_t kHelloBytes = kStoreHelloBytes;
constexpr std::size_t kRequestBytes = kStoreRequestBytes;
constexpr std::size_t kResponseBytes = kStoreResponseBytes;
constexpr auto kHelloTimeout = std::chrono::seconds(10);

std::vector<std::uint8_t> encode_i64(std::int64_t value) {
  std::vector<std::uint8_t> out(8);
  put_le(out.data(), static_cast<std::uint64_t>(value));
  return out;
}
std::int64_t decode_i64(const std::uint8_t* in) {
  return static_cast<std::int64_t>(get_le<std::uint64_t>(in));
}

}  // namespace

// ---- protocol -------------------------------------------------------------------------------

bool parse_store_hello(const std::uint8_t* hello, std::uint32_t& token_bytes) {
  token_bytes = get_le<std::uint32_t>(hello + 12);
  return std::memcmp(hello, kStoreMagic, 8) == 0 &&
         get_le<std::uint32_t>(hello + 8) == kStoreProtocolVersion && token_bytes <= kMaxTokenBytes;
}

bool parse_store_request(const std::uint8_t* header, StoreRequestHeader& request) {
  request.command = header[0];
  request.key_bytes = get_le<std::uint32_t>(header + 1);
  request.value_bytes = get_le<std::uint32_t>(header + 5);
  return request.key_bytes > 0 && request.key_bytes <= kMaxKeyBytes &&
         request.value_bytes <= kMaxValueBytes;
}

bool serve_store_request(StoreTable& table, const StoreRequestHeader& request,
                         const std::vector<std::uint8_t>& body,
                         std::vector<std::uint8_t>& response) {
  if (body.size() != std::size_t{request.key_bytes} + request.value_bytes) return false;
  const std::string key(body.begin(), body.begin() + request.key_bytes);
  std::vector<std::uint8_t> value(body.begin() + request.key_bytes, body.end());
  std::uint8_t status = 1;
  std::vector<std::uint8_t> payload;
  switch (request.command) {
    case 1:  // set
      table[key] = std::move(value);
      break;
    case 2: {  // get
      auto it = table.find(key);
      if (it == table.end())
        status = 0;
      else
        payload = it->second;
      break;
    }
    case 3: {  // add
      if (value.size() != 8) return false;
      std::int64_t current = 0;
      auto it = table.find(key);
      if (it != table.end()) {
        // Counters are kept as decimal text, as the file store keeps them.
        const std::string text(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        current = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || errno == ERANGE || end != text.c_str() + text.size()) return false;
      }
      // A counter that would overflow is a client's mistake, not something to wrap silently.
      if (__builtin_add_overflow(current, decode_i64(value.data()), &current)) return false;
      payload = encode_i64(current);
      const std::string text = std::to_string(current);
      table[key].assign(text.begin(), text.end());
      break;
    }
    default:
      return false;
  }
  response.assign(kResponseBytes, 0);
  response[0] = status;
  put_le<std::uint32_t>(response.data() + 1, static_cast<std::uint32_t>(payload.size()));
  response.insert(response.end(), payload.begin(), payload.end());
  return true;
}

// ---- server ---------------------------------------------------------------------------------

struct TcpStoreServer::State {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string token;
  StoreTable data;  // touched by the io thread only
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Data = StoreTable;
  Session(tcp::socket socket, const std::string& token, Data& data)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), token_(token), data_(data) {}

  void start() {
    // A client that does not finish its hello in time (a stranger, a port scanner) is dropped.
    timer_.expires_after(kHelloTimeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && !self->accepted_) self->close();
    });
    asio::async_read(socket_, asio::buffer(header_, kHelloBytes),
                     [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                       if (!ec)
                         self->on_hello();
                       else
                         self->close();
                     });
  }

 private:
  void close() {
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
  }

  void on_hello() {
    std::uint32_t token_bytes = 0;
    if (!parse_store_hello(header_, token_bytes)) return close();
    body_.resize(token_bytes);
    asio::async_read(
        socket_, asio::buffer(body_),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (ec || std::string(self->body_.begin(), self->body_.end()) != self->token_) {
            return self->close();
          }
          self->accepted_ = true;
          self->timer_.cancel();
          asio::async_write(self->socket_, asio::buffer(kStoreAccept, 8),
                            [self](const boost::system::error_code& e, std::size_t) {
                              if (!e)
                                self->read_request();
                              else
                                self->close();
                            });
        });
  }

  void read_request() {
    asio::async_read(
        socket_, asio::buffer(header_, kRequestBytes),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (ec || !parse_store_request(self->header_, self->request_)) {
            return self->close();
          }
          self->body_.resize(std::size_t{self->request_.key_bytes} + self->request_.value_bytes);
          asio::async_read(self->socket_, asio::buffer(self->body_),
                           [self](const boost::system::error_code& e, std::size_t) {
                             if (e) return self->close();
                             self->serve();
                           });
        });
  }

  void serve() {
    if (!serve_store_request(data_, request_, body_, response_)) return close();
    asio::async_write(
        socket_, asio::buffer(response_),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (!ec)
            self->read_request();
          else
            self->close();
        });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  const std::string& token_;
  Data& data_;
  bool accepted_ = false;
  std::uint8_t header_[kHelloBytes] = {};
  StoreRequestHeader request_;
  std::vector<std::uint8_t> body_;
  std::vector<std::uint8_t> response_;
};

void accept_next(const std::shared_ptr<TcpStoreServer::State>& state);

}  // namespace

namespace {
void accept_next(const std::shared_ptr<TcpStoreServer::State>& state) {
  state->acceptor.async_accept([state](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
    if (!ec) std::make_shared<Session>(std::move(socket), state->token, state->data)->start();
    accept_next(state);
  });
}
}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const std::string& token)
    : state_(std::make_shared<State>()) {
  PARTRAIN_CHECK(token.size() <= kMaxTokenBytes, UsageError, "tcp store: run token longer than ",
                 kMaxTokenBytes, " bytes");
  state_->token = token;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  PARTRAIN_CHECK(!ec, UsageError, "tcp store: cannot serve on '", host,
                 "': not an IP address of this machine");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  // A port in use or an address not on this machine is a setting to change, not a failure
  // of the run: exit 2 with the address.
  PARTRAIN_CHECK(!ec, UsageError, "tcp store: cannot listen on ", net::join_host_port(host, port),
                 ": ", ec.message(), " (choose another --master-port or launch.rendezvous)");
  port_ = state_->acceptor.local_endpoint().port();
  accept_next(state_);
  thread_ = std::thread([state = state_] { state->io.run(); });
}

TcpStoreServer::~TcpStoreServer() {
  state_->io.stop();
  if (thread_.joinable()) thread_.join();
  // The pending accept's handler holds the state, which owns the io context holding that
  // handler: a cycle that would leak both. Closing the acceptor and polling lets the handler
  // finish (aborted, without re-arming); sessions still queued go with the io context.
  boost::system::error_code ignored;
  state_->acceptor.close(ignored);
  state_->io.restart();
  state_->io.poll();
}

// ---- client ---------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, const StoreOptions& options)
    : timeout_(options.timeout), socket_(io_) {
  PARTRAIN_CHECK(options.token.size() <= kMaxTokenBytes, UsageError,
                 "tcp store: run token longer than ", kMaxTokenBytes, " bytes");
  port_ = port;
  if (options.host_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port, options.token);
    port_ = server_->port();
  }
  endpoint_ = net::join_host_port(host, port_);
  const auto deadline = net::deadline_after(timeout_);
  PARTRAIN_CHECK(net::connect_with_retry(io_, socket_, host, port_, deadline), CommError,
                 "tcp store: no server at ", endpoint_, " within ", timeout_.count(), " ms");
  socket_.set_option(tcp::no_delay(true));
  std::vector<std::uint8_t> hello(kHelloBytes);
  std::memcpy(hello.data(), kStoreMagic, 8);
  put_le<std::uint32_t>(hello.data() + 8, kStoreProtocolVersion);
  put_le<std::uint32_t>(hello.data() + 12, static_cast<std::uint32_t>(options.token.size()));
  hello.insert(hello.end(), options.token.begin(), options.token.end());
  auto sent = net::write_all(io_, socket_, hello.data(), hello.size(), deadline);
  char answer[8] = {};
  auto got = sent.ok() ? net::read_exact(io_, socket_, answer, 8, deadline) : sent;
  PARTRAIN_CHECK(got.ok() && std::memcmp(answer, kStoreAccept, 8) == 0, CommError, "tcp store at ",
                 endpoint_, " refused this client (wrong run token, or not a partrain store): ",
                 got.ok() ? "bad answer" : got.message);
}

TcpStore::~TcpStore() {
  boost::system::error_code ignored;
  socket_.close(ignored);
}

std::vector<std::uint8_t> TcpStore::request(Command command, const std::string& key,
                                            const std::vector<std::uint8_t>& value) {
  PARTRAIN_CHECK(!key.empty() && key.size() <= kMaxKeyBytes, UsageError,
                 "tcp store: key must have 1 to ", kMaxKeyBytes, " bytes");
  PARTRAIN_CHECK(value.size() <= kMaxValueBytes, UsageError, "tcp store: value of ", value.size(),
                 " bytes is over the limit of ", kMaxValueBytes);
  std::lock_guard<std::mutex> lock(mutex_);
  PARTRAIN_CHECK(socket_.is_open(), CommError, "tcp store: connection to ", endpoint_,
                 " was lost earlier");
  std::vector<std::uint8_t> message(kRequestBytes);
  message[0] = static_cast<std::uint8_t>(command);
  put_le<std::uint32_t>(message.data() + 1, static_cast<std::uint32_t>(key.size()));
  put_le<std::uint32_t>(message.data() + 5, static_cast<std::uint32_t>(value.size()));
  message.insert(message.end(), key.begin(), key.end());
  message.insert(message.end(), value.begin(), value.end());
  const auto deadline = net::deadline_after(timeout_);
  auto result = net::write_all(io_, socket_, message.data(), message.size(), deadline);
  std::uint8_t header[kResponseBytes] = {};
  if (result.ok()) result = net::read_exact(io_, socket_, header, kResponseBytes, deadline);
  std::vector<std::uint8_t> payload;
  if (result.ok()) {
    const std::uint32_t bytes = get_le<std::uint32_t>(header + 1);
    if (bytes > kMaxValueBytes) {
      result = {net::IoStatus::error, "oversized answer"};
    } else {
      payload.resize(bytes);
      result = net::read_exact(io_, socket_, payload.data(), bytes, deadline);
    }
  }
  if (!result.ok()) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    throw CommError("tcp store: request for key '" + key + "' to " + endpoint_ +
                    " failed: " + result.message);
  }
  if (header[0] == 0)
    payload.assign(1, 0xff);  // not found: marked below by try_get
  else
    payload.insert(payload.begin(), 0x01);
  return payload;
}

void TcpStore::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  request(Command::set, key, value);
}

bool TcpStore::try_get(const std::string& key, std::vector<std::uint8_t>& value) {
  auto answer = request(Command::get, key, {});
  if (answer.front() != 0x01) return false;
  value.assign(answer.begin() + 1, answer.end());
  return true;
}

std::vector<std::uint8_t> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<std::uint8_t> value;
  PARTRAIN_CHECK(try_get(key, value), CommError, "tcp store: key '", key, "' vanished");
  return value;
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  auto answer = request(Command::add, key, encode_i64(delta));
  PARTRAIN_CHECK(answer.size() == 9, CommError, "tcp store: bad answer to add('", key, "')");
  return decode_i64(answer.data() + 1);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::vector<std::uint8_t> ignored;
  for (const auto& key : keys) {
    if (!try_get(key, ignored)) return false;
  }
  return true;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  std::vector<std::uint8_t> ignored;
  for (const auto& key : keys) {
    while (!try_get(key, ignored)) {
      PARTRAIN_CHECK(Clock::now() < deadline, CommError, "tcp store ", endpoint_, ": key '", key,
                     "' did not appear within ", timeout.count(), " ms");
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }
}

}  // namespace partrain::comm
