#include "comm_backends/store/tcp_store.h"

#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>

#ifdef _WIN32
#ifndef NOMINMAX
#define NOMINMAX  // windows.h's min and max macros would break std::max below
#endif
#include <windows.h>
#else
#include <pthread.h>
#include <time.h>
#endif

#include "common/byte_codec.h"
#include "common/errors.h"
#include "comm_backends/net/open_files.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/shm/host_identity.h"
#include "common/process_state.h"

namespace partrain::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using net::Clock;

namespace {

constexpr std::size_t kHelloBytes = kStoreHelloBytes;
constexpr std::size_t kRequestBytes = kStoreRequestBytes;
constexpr std::size_t kResponseBytes = kStoreResponseBytes;
constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr auto kAcceptRetryPause = std::chrono::milliseconds(50);
// Connections taken from the listen queue per wake-up before the server serves others.
constexpr int kAcceptBurst = 1024;
// The listen backlog asked for: the kernel caps it at its own limit (net.core.somaxconn), so
// a host tuned for large jobs gets what it allows.
constexpr int kListenBacklog = 65535;
// What the nodes of a multi-node `partrain run` derive their run token from, as the messages
// about a token that differs name it (choose_run_token(), cli/launcher.cpp).
constexpr const char* kTokenSources = "config, --nnodes, --nproc-per-node or PARTRAIN_RUN_TOKEN";

std::vector<std::uint8_t> encode_i64(std::int64_t value) {
  std::vector<std::uint8_t> out(8);
  put_le(out.data(), static_cast<std::uint64_t>(value));
  return out;
}
std::int64_t decode_i64(const std::uint8_t* in) {
  return static_cast<std::int64_t>(get_le<std::uint64_t>(in));
}
// The steady clock as the protocol carries it: nanoseconds.
std::int64_t steady_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

// ---- protocol -------------------------------------------------------------------------------

namespace {

// A client's opening: magic | version | u32 bytes | payload, and its check.
std::vector<std::uint8_t> opening(const char (&magic)[8], std::string_view payload) {
  std::vector<std::uint8_t> hello(kHelloBytes + payload.size());
  std::memcpy(hello.data(), magic, 8);
  put_le<std::uint32_t>(hello.data() + 8, kStoreProtocolVersion);
  put_le<std::uint32_t>(hello.data() + 12, static_cast<std::uint32_t>(payload.size()));
  std::memcpy(hello.data() + kHelloBytes, payload.data(), payload.size());
  return hello;
}
bool parse_opening(const std::uint8_t* hello, const char (&magic)[8], std::uint32_t limit,
                   std::uint32_t& payload_bytes) {
  payload_bytes = get_le<std::uint32_t>(hello + 12);
  return std::memcmp(hello, magic, 8) == 0 &&
         get_le<std::uint32_t>(hello + 8) == kStoreProtocolVersion && payload_bytes <= limit;
}

// A server's answer that carries text: magic | u32 bytes | text.
std::vector<std::uint8_t> answer_with_text(const char (&magic)[8], const std::string& text) {
  std::vector<std::uint8_t> answer(magic, magic + 8);
  answer.resize(12 + text.size());
  put_le<std::uint32_t>(answer.data() + 8, static_cast<std::uint32_t>(text.size()));
  std::memcpy(answer.data() + 12, text.data(), text.size());
  return answer;
}

// The clause a failed request's message ends with: whom the server serves as where it said,
// and where it did not answer in time but shares this machine, what its process does (a rank
// frozen by SIGSTOP freezes the store it serves with it). A closed connection is the process
// exiting, or closing the store as it goes.
std::string serving_process(const std::optional<StoreServerProcess>& server, bool closed) {
  const std::string who =
      server && !server->role.empty() ? server->role : "rank 0, or partrain run's launcher";
  if (closed) return "; the process serving the store (" + who + ") has exited";
  if (!server) return "";
  const auto mark = decode_process_mark(server->mark);
  if (!mark || mark->pid == current_process_id()) return "";
  const auto state = watch_marked_process(*mark);
  if (!state || state->kind == ProcessState::Kind::ended) return "";
  return "; the process serving the store, " + who + " (pid " + std::to_string(mark->pid) +
         ", this machine), " + describe_process_state(*state, mark->pid);
}

}  // namespace

std::string store_accept_text(const std::string& clock, const StoreServerProcess& server) {
  return clock + "\n" + server.mark + "\n" + server.role;
}

StoreAcceptText parse_store_accept_text(std::string_view text) {
  StoreAcceptText parsed;
  const auto first = text.find('\n');
  parsed.clock = std::string(text.substr(0, first));
  if (first == std::string_view::npos) return parsed;
  text.remove_prefix(first + 1);
  const auto second = text.find('\n');
  StoreServerProcess server;
  server.mark = std::string(text.substr(0, second));
  if (second != std::string_view::npos) server.role = std::string(text.substr(second + 1));
  parsed.server = std::move(server);
  return parsed;
}

bool parse_store_hello(const std::uint8_t* hello, std::uint32_t& token_bytes) {
  return parse_opening(hello, kStoreMagic, kMaxTokenBytes, token_bytes);
}

bool parse_store_notice(const std::uint8_t* hello, std::uint32_t& text_bytes) {
  return parse_opening(hello, kStoreNoticeMagic, kMaxNoticeBytes, text_bytes);
}

namespace {
constexpr std::uint32_t kMaxJoinPayloadBytes =
    4 + kMaxTokenBytes + 4 + kMaxKeyBytes + kMaxJoinValueBytes;
}  // namespace

bool parse_store_join(const std::uint8_t* hello, std::uint32_t& payload_bytes) {
  return parse_opening(hello, kStoreJoinMagic, kMaxJoinPayloadBytes, payload_bytes);
}

std::vector<std::uint8_t> store_join_payload(const StoreJoin& join) {
  std::vector<std::uint8_t> out(4 + join.token.size() + 4 + join.key.size() + join.value.size());
  std::uint8_t* at = out.data();
  put_le<std::uint32_t>(at, static_cast<std::uint32_t>(join.token.size()));
  std::memcpy(at + 4, join.token.data(), join.token.size());
  at += 4 + join.token.size();
  put_le<std::uint32_t>(at, static_cast<std::uint32_t>(join.key.size()));
  std::memcpy(at + 4, join.key.data(), join.key.size());
  at += 4 + join.key.size();
  if (!join.value.empty()) std::memcpy(at, join.value.data(), join.value.size());
  return out;
}

std::optional<StoreJoin> parse_store_join_payload(const std::vector<std::uint8_t>& payload) {
  // A length and what it counts, within what is left and under `limit`; nullopt otherwise.
  std::size_t at = 0;
  const auto text = [&](std::uint32_t limit) -> std::optional<std::string> {
    if (payload.size() - at < 4) return std::nullopt;
    const std::uint32_t bytes = get_le<std::uint32_t>(payload.data() + at);
    at += 4;
    if (bytes > limit || bytes > payload.size() - at) return std::nullopt;
    std::string out(payload.begin() + static_cast<std::ptrdiff_t>(at),
                    payload.begin() + static_cast<std::ptrdiff_t>(at + bytes));
    at += bytes;
    return out;
  };
  StoreJoin join;
  auto token = text(kMaxTokenBytes);
  if (!token) return std::nullopt;
  auto key = text(kMaxKeyBytes);
  if (!key || key->empty() || payload.size() - at > kMaxJoinValueBytes) return std::nullopt;
  join.token = std::move(*token);
  join.key = std::move(*key);
  join.value.assign(payload.begin() + static_cast<std::ptrdiff_t>(at), payload.end());
  return join;
}

std::string notice_line(const std::vector<std::uint8_t>& text) {
  std::string line(text.begin(), text.end());
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return line;
}

bool parse_store_request(const std::uint8_t* header, StoreRequestHeader& request) {
  request.command = header[0];
  request.key_bytes = get_le<std::uint32_t>(header + 1);
  request.value_bytes = get_le<std::uint32_t>(header + 5);
  return request.key_bytes > 0 && request.key_bytes <= kMaxKeyBytes &&
         request.value_bytes <= kMaxValueBytes;
}

namespace {

std::vector<std::uint8_t> answer_bytes(StoreStatus status, const std::uint8_t* value,
                                       std::size_t bytes) {
  std::vector<std::uint8_t> response(kResponseBytes + bytes, 0);
  response[0] = static_cast<std::uint8_t>(status);
  put_le<std::uint32_t>(response.data() + 1, static_cast<std::uint32_t>(bytes));
  if (bytes > 0) std::memcpy(response.data() + kResponseBytes, value, bytes);
  return response;
}

}  // namespace

std::vector<std::uint8_t> store_wait_answer(const std::vector<std::uint8_t>* value, bool wants) {
  if (value == nullptr) return answer_bytes(StoreStatus::timed_out, nullptr, 0);
  return wants ? answer_bytes(StoreStatus::present, value->data(), value->size())
               : answer_bytes(StoreStatus::present, nullptr, 0);
}

std::size_t first_missing(const StoreTable& table, const std::vector<std::string>& keys,
                          std::size_t from) {
  while (from < keys.size() && table.count(keys[from]) != 0) ++from;
  return from;
}

std::vector<std::uint8_t> store_many_timed_out(std::size_t missing) {
  std::uint8_t index[4];
  put_le<std::uint32_t>(index, static_cast<std::uint32_t>(missing));
  return answer_bytes(StoreStatus::timed_out, index, sizeof(index));
}

std::vector<std::uint8_t> store_many_answer(const StoreTable& table,
                                            const std::vector<std::string>& keys) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    bytes += 4 + table.at(keys[i]).size();
    if (bytes > kMaxValueBytes) {  // no client could take it: say where it overflowed
      std::uint8_t index[4];
      put_le<std::uint32_t>(index, static_cast<std::uint32_t>(i));
      return answer_bytes(StoreStatus::absent, index, sizeof(index));
    }
  }
  std::vector<std::uint8_t> response(kResponseBytes + bytes);
  response[0] = static_cast<std::uint8_t>(StoreStatus::present);
  put_le<std::uint32_t>(response.data() + 1, static_cast<std::uint32_t>(bytes));
  std::uint8_t* out = response.data() + kResponseBytes;
  for (const auto& key : keys) {
    const std::vector<std::uint8_t>& value = table.at(key);
    put_le<std::uint32_t>(out, static_cast<std::uint32_t>(value.size()));
    if (!value.empty()) std::memcpy(out + 4, value.data(), value.size());
    out += 4 + value.size();
  }
  return response;
}

namespace {

// A get many's value: u32 timeout ms | u32 n | n x (u32 bytes | key). False when it does not
// parse to exactly that, or a key is empty or too long.
bool parse_many(const std::uint8_t* value, std::size_t bytes, std::string first, StoreWait& wait) {
  if (bytes < 8) return false;
  wait.ms = get_le<std::uint32_t>(value);
  const std::uint32_t more = get_le<std::uint32_t>(value + 4);
  // Each further key takes at least 5 bytes: a count past that is a lie, refused before any
  // allocation it would cause.
  if (more > (bytes - 8) / 5) return false;
  wait.keys.clear();
  wait.keys.reserve(std::size_t{more} + 1);
  wait.keys.push_back(std::move(first));
  std::size_t at = 8;
  for (std::uint32_t i = 0; i < more; ++i) {
    if (bytes - at < 4) return false;
    const std::uint32_t length = get_le<std::uint32_t>(value + at);
    at += 4;
    if (length == 0 || length > kMaxKeyBytes || bytes - at < length) return false;
    wait.keys.emplace_back(reinterpret_cast<const char*>(value + at), length);
    at += length;
  }
  wait.many = true;
  return at == bytes;
}

}  // namespace

StoreServed serve_store_request(StoreTable& table, const StoreRequestHeader& request,
                                const std::vector<std::uint8_t>& body,
                                std::vector<std::uint8_t>& response, StoreWait& wait) {
  if (body.size() != std::size_t{request.key_bytes} + request.value_bytes) {
    return StoreServed::drop;
  }
  const std::string key(body.begin(), body.begin() + request.key_bytes);
  const std::uint8_t* value = body.data() + request.key_bytes;
  const std::size_t value_bytes = request.value_bytes;
  switch (static_cast<StoreCommand>(request.command)) {
    case StoreCommand::set:
      table[key].assign(value, value + value_bytes);
      response = answer_bytes(StoreStatus::present, nullptr, 0);
      return StoreServed::answer;
    case StoreCommand::get: {
      const auto it = table.find(key);
      response = it == table.end()
                     ? answer_bytes(StoreStatus::absent, nullptr, 0)
                     : answer_bytes(StoreStatus::present, it->second.data(), it->second.size());
      return StoreServed::answer;
    }
    case StoreCommand::add: {
      if (value_bytes != 8) return StoreServed::drop;
      std::int64_t current = 0;
      auto it = table.find(key);
      if (it != table.end()) {
        // Counters are kept as decimal text, as the file store keeps them.
        const std::string text(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        current = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || errno == ERANGE || end != text.c_str() + text.size()) {
          return StoreServed::drop;
        }
      }
      // A counter that would overflow is a client's mistake, not something to wrap silently.
      if (__builtin_add_overflow(current, decode_i64(value), &current)) return StoreServed::drop;
      const auto encoded = encode_i64(current);
      response = answer_bytes(StoreStatus::present, encoded.data(), encoded.size());
      const std::string text = std::to_string(current);
      table[key].assign(text.begin(), text.end());
      return StoreServed::answer;
    }
    case StoreCommand::wait: {
      if (value_bytes != kStoreWaitBytes || (value[4] & ~kStoreWaitWantsValue) != 0) {
        return StoreServed::drop;
      }
      const auto it = table.find(key);
      if (it != table.end()) {
        response = store_wait_answer(&it->second, (value[4] & kStoreWaitWantsValue) != 0);
        return StoreServed::answer;
      }
      wait.ms = get_le<std::uint32_t>(value);
      wait.keys = {key};
      wait.many = false;
      wait.wants_value = (value[4] & kStoreWaitWantsValue) != 0;
      return StoreServed::wait;
    }
    case StoreCommand::clock: {  // the answer's header carries the clock
      if (value_bytes != 0) return StoreServed::drop;
      response = answer_bytes(StoreStatus::present, nullptr, 0);
      return StoreServed::answer;
    }
    case StoreCommand::get_many: {
      if (!parse_many(value, value_bytes, key, wait)) return StoreServed::drop;
      if (first_missing(table, wait.keys) == wait.keys.size()) {
        response = store_many_answer(table, wait.keys);
        wait.keys.clear();  // keys name what a parked request waits for, and this one is not
        return StoreServed::answer;
      }
      return StoreServed::wait;
    }
  }
  return StoreServed::drop;
}

// ---- server ---------------------------------------------------------------------------------

// A connection parked in a wait, told when its key is set.
struct StoreWaiter {
  virtual ~StoreWaiter() = default;
  virtual void key_set(const std::string& key) = 0;
};

struct TcpStoreServer::State {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_pause{io};  // after an accept error: a pause, not a hot loop
  std::string token;
  // A stand-in's answer to every hello: kStoreFailed, u32 bytes, the line; empty otherwise.
  std::vector<std::uint8_t> failed;
  std::atomic<std::uint64_t> told{0};
  std::atomic<std::int64_t> last_heard_ns{0};  // steady clock; 0: nobody told or heard yet
  // What a client that passes the hello is sent: kStoreAccept, then the identity of this
  // process's steady clock (u32 bytes | text).
  std::vector<std::uint8_t> accept;
  // Touched by the io thread only.
  StoreTable data;
  std::map<std::string, std::vector<std::weak_ptr<StoreWaiter>>> waiters;
  bool told_accept_error = false;
  // Partrain clients refused for another run's token, by address (refused_clients()).
  mutable std::mutex refused_mutex;
  std::vector<std::string> refused;
  // What partrain processes that could not join told (notices()), under the same mutex.
  std::vector<std::string> notices;
  // Read by other threads.
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::int64_t> first_connection_ns{0};  // steady clock; 0: nobody yet
#ifdef _WIN32
  // A handle to the io thread for GetThreadTimes. std::thread's native handle is a HANDLE
  // under MSVC but a pthread_t under MinGW's winpthreads, so the thread opens its own.
  std::atomic<HANDLE> io_thread{nullptr};
  ~State() {
    if (HANDLE h = io_thread.load()) CloseHandle(h);
  }
#endif

  // Wakes every connection waiting for `key` (which has just been set).
  void key_set(const std::string& key) {
    const auto it = waiters.find(key);
    if (it == waiters.end()) return;
    std::vector<std::weak_ptr<StoreWaiter>> woken = std::move(it->second);
    waiters.erase(it);
    for (const auto& weak : woken) {
      if (const auto waiter = weak.lock()) waiter->key_set(key);
    }
  }
};

namespace {

class Session : public StoreWaiter, public std::enable_shared_from_this<Session> {
 public:
  using State = TcpStoreServer::State;
  Session(tcp::socket socket, State& state)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), state_(state) {}

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

  // The key this connection waits for has been set: answer now, or, for a get many with
  // keys still missing, wait for the next of them.
  void key_set(const std::string& key) override {
    if (!waiting_ || key != wait_.keys[waiting_for_]) return;
    waiting_for_ = first_missing(state_.data, wait_.keys, waiting_for_ + 1);
    if (waiting_for_ < wait_.keys.size()) {
      state_.waiters[wait_.keys[waiting_for_]].push_back(weak_from_this());
      return;
    }
    waiting_ = false;
    timer_.cancel();
    answer(wait_.many ? store_many_answer(state_.data, wait_.keys)
                      : store_wait_answer(&state_.data.find(key)->second, wait_.wants_value));
  }

 private:
  void close() {
    boost::system::error_code ignored;
    waiting_ = false;
    timer_.cancel();
    socket_.close(ignored);
  }

  // A partrain client of another run: most often a node whose command differs from this one's,
  // which stops at once while this run's ranks wait for it. Said here, on the node that waits,
  // once for each address (the first TcpStoreServer::kRefusedNamed of them).
  void tell_refused() {
    boost::system::error_code ec;
    const auto peer = socket_.remote_endpoint(ec);
    const std::string address = ec ? std::string("an unknown address") : peer.address().to_string();
    {
      std::lock_guard<std::mutex> lock(state_.refused_mutex);
      if (state_.refused.size() >= TcpStoreServer::kRefusedNamed ||
          std::find(state_.refused.begin(), state_.refused.end(), address) !=
              state_.refused.end()) {
        return;
      }
      state_.refused.push_back(address);
    }
    boost::system::error_code ignored;
    const int port = socket_.local_endpoint(ignored).port();
    std::fprintf(stderr,
                 "partrain: tcp store on port %d refused a partrain process at %s: its run token "
                 "differs from this run's (a node whose command differs from this one's: %s; or "
                 "another job using this port)\n",
                 port, address.c_str(), kTokenSources);
    std::fflush(stderr);
  }

  // A partrain process that could not join (a node that could not read its config, say): its
  // line is kept for the ranks of this host (TcpStoreServer::notices()) and said here at once.
  void keep_notice(const std::string& line) {
    boost::system::error_code ec;
    const auto peer = socket_.remote_endpoint(ec);
    const std::string address = ec ? std::string("an unknown address") : peer.address().to_string();
    state_.last_heard_ns.store(steady_ns(Clock::now()));
    {
      std::lock_guard<std::mutex> lock(state_.refused_mutex);
      if (state_.notices.size() >= TcpStoreServer::kNoticesKept) return;
      state_.notices.push_back(line);
    }
    boost::system::error_code ignored;
    const int port = socket_.local_endpoint(ignored).port();
    std::fprintf(stderr, "partrain: tcp store on port %d: the partrain process at %s says: %s\n",
                 port, address.c_str(), line.c_str());
    std::fflush(stderr);
  }

  // The text of a notice's hello, then the answer that it was heard; the hello timer bounds it.
  void read_notice(std::uint32_t text_bytes) {
    body_.resize(text_bytes);
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                       if (ec) return self->close();
                       self->keep_notice(notice_line(self->body_));
                       asio::async_write(self->socket_, asio::buffer(kStoreNoted, 8),
                                         [self](const boost::system::error_code&, std::size_t) {
                                           self->close();
                                         });
                     });
  }

  // A stand-in for a master node that could not start: the line, whatever the token; the hello
  // timer bounds the write.
  void tell_failed() {
    state_.told.fetch_add(1);
    state_.last_heard_ns.store(steady_ns(Clock::now()));
    asio::async_write(socket_, asio::buffer(state_.failed),
                      [self = shared_from_this()](const boost::system::error_code&, std::size_t) {
                        self->close();
                      });
  }

  // The hello timer still runs, so a client that never reads the answer is dropped too.
  void refuse() {
    asio::async_write(socket_, asio::buffer(kStoreRefuse, 8),
                      [self = shared_from_this()](const boost::system::error_code&, std::size_t) {
                        self->close();
                      });
  }

  void on_hello() {
    std::uint32_t payload_bytes = 0;
    if (parse_store_notice(header_, payload_bytes)) return read_notice(payload_bytes);
    // A join's hello carries a key to set with the token (kStoreJoinMagic); a hello, the token.
    const bool join = parse_store_join(header_, payload_bytes);
    if (!join && !parse_store_hello(header_, payload_bytes)) return close();
    body_.resize(payload_bytes);
    asio::async_read(
        socket_, asio::buffer(body_),
        [self = shared_from_this(), join](const boost::system::error_code& ec, std::size_t) {
          if (ec) return self->close();
          if (!self->state_.failed.empty()) return self->tell_failed();
          const std::optional<StoreJoin> joined =
              join ? parse_store_join_payload(self->body_) : std::nullopt;
          if (join && !joined) return self->close();
          const std::string token =
              joined ? joined->token : std::string(self->body_.begin(), self->body_.end());
          if (token != self->state_.token) {
            self->tell_refused();
            return self->refuse();
          }
          if (joined) {
            self->state_.data[joined->key] = joined->value;
            self->state_.key_set(joined->key);
          }
          self->accepted_ = true;
          self->timer_.cancel();
          asio::async_write(self->socket_, asio::buffer(self->state_.accept),
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
    switch (serve_store_request(state_.data, request_, body_, response_, wait_)) {
      case StoreServed::drop:
        return close();
      case StoreServed::wait:
        return park();
      case StoreServed::answer:
        break;
    }
    const auto command = static_cast<StoreCommand>(request_.command);
    answer(std::move(response_));
    if (command == StoreCommand::set || command == StoreCommand::add) {
      state_.key_set(std::string(body_.begin(), body_.begin() + request_.key_bytes));
    }
  }

  // Waits for the keys without polling: the set that makes the first missing one wakes this
  // connection (State::key_set), which then waits for the next; the client's own timeout
  // bounds the whole wait.
  void park() {
    waiting_ = true;
    waiting_for_ = first_missing(state_.data, wait_.keys);
    state_.waiters[wait_.keys[waiting_for_]].push_back(weak_from_this());
    timer_.expires_after(std::chrono::milliseconds(wait_.ms));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || !self->waiting_) return;
      self->waiting_ = false;
      self->answer(self->wait_.many ? store_many_timed_out(self->waiting_for_)
                                    : store_wait_answer(nullptr, false));
    });
    // A client sends nothing while it waits: a read that ends means it went away (or broke
    // the protocol), and the connection goes at once rather than at the wait's timeout.
    socket_.async_read_some(
        asio::buffer(watch_, 1),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (ec == asio::error::operation_aborted && !self->closing_watch_) {
            return;
          }
          if (self->closing_watch_) {
            self->closing_watch_ = false;
            return self->send_pending();
          }
          self->close();
        });
  }

  void answer(std::vector<std::uint8_t> response) {
    state_.requests.fetch_add(1, std::memory_order_relaxed);
    pending_ = std::move(response);
    if (watching()) {
      // The watch read is still pending: cancel it, and send once its handler has run, so
      // that a later read_request() never races it for the socket.
      closing_watch_ = true;
      boost::system::error_code ignored;
      socket_.cancel(ignored);
      return;
    }
    send_pending();
  }

  bool watching() const { return !wait_.keys.empty(); }

  void send_pending() {
    wait_.keys.clear();
    put_le<std::uint64_t>(pending_.data() + 5, static_cast<std::uint64_t>(steady_ns(Clock::now())));
    asio::async_write(
        socket_, asio::buffer(pending_),
        [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
          if (!ec)
            self->read_request();
          else
            self->close();
        });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  State& state_;
  bool accepted_ = false;
  bool waiting_ = false;         // parked in a wait, not yet answered
  bool closing_watch_ = false;   // the answer waits for the watch read to be cancelled
  StoreWait wait_;               // its keys are set from park() until the answer is sent
  std::size_t waiting_for_ = 0;  // the index in wait_.keys of the key this connection waits for
  std::uint8_t header_[kHelloBytes] = {};
  std::uint8_t watch_[1] = {};
  StoreRequestHeader request_;
  std::vector<std::uint8_t> body_;
  std::vector<std::uint8_t> response_;
  std::vector<std::uint8_t> pending_;
};

void accept_next(const std::shared_ptr<TcpStoreServer::State>& state);

// Where the server listens for clients that dial `host`. A loopback name or literal keeps it
// on loopback, and an IP literal is taken as the address to serve on. A host name is served
// on every address of this host: what the name resolves to here (Debian maps its own name
// to 127.0.1.1) need not be what the other hosts reach it at.
asio::ip::address listen_address(const std::string& host) {
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  const std::string name = bracketed ? host.substr(1, host.size() - 2) : host;
  if (name == "localhost") return asio::ip::make_address("127.0.0.1");
  boost::system::error_code ec;
  const auto literal = asio::ip::make_address(name, ec);
  if (!ec) return literal;
  PARTRAIN_CHECK(!name.empty() && name.find_first_of(" /:[]") == std::string::npos, UsageError,
                 "tcp store: cannot serve on '", host, "': not a host name or IP address");
  // The IPv6 wildcard where this host has IPv6 at all, else the IPv4 one.
  asio::io_context io;
  tcp::acceptor probe(io);
  probe.open(tcp::v6(), ec);
  if (ec) return asio::ip::address_v4::any();
  return asio::ip::address_v6::any();
}

}  // namespace

namespace {

// Says once why connections wait unaccepted (most often: out of descriptors, one a client).
void tell_accept_error(TcpStoreServer::State& state, const boost::system::error_code& ec) {
  if (state.told_accept_error) return;
  state.told_accept_error = true;
  const net::OpenFileLimit limit = net::open_file_limit();
  std::string why = ec.message();
  if (ec == asio::error::no_descriptors && limit.known) {
    why += " (this process may open " + std::to_string(limit.soft) + " files, hard limit " +
           std::to_string(limit.hard) +
           ": each store client holds one; raise the hard limit with ulimit -Hn or the "
           "service's LimitNOFILE)";
  }
  std::fprintf(stderr, "partrain: tcp store: cannot accept a connection: %s; retrying\n",
               why.c_str());
  std::fflush(stderr);
}

void pause_then_accept(const std::shared_ptr<TcpStoreServer::State>& state,
                       const boost::system::error_code& ec) {
  // A connection waits in the backlog until a descriptor frees up; retried after a pause, so
  // the loop does not spin on an error that persists.
  tell_accept_error(*state, ec);
  state->accept_pause.expires_after(kAcceptRetryPause);
  state->accept_pause.async_wait([state](const boost::system::error_code& e) {
    if (!e && state->acceptor.is_open()) accept_next(state);
  });
}

// Waits until the listening socket is readable, then takes up to kAcceptBurst connections
// from the kernel's queue before waiting again. When thousands of ranks dial at once the
// queue (capped by net.core.somaxconn) overflows if it is drained one connection per wake-up,
// and a client whose SYN is dropped waits the kernel's back-off (1, 3, 7 s ...) to retry.
// On Windows a socket accepted from a non-blocking listener is itself non-blocking, unknown
// to asio, and its sessions' completions never came (every client timed out in its hello
// under Wine): there the server takes one connection per completed async_accept.
void accept_next(const std::shared_ptr<TcpStoreServer::State>& state) {
  const auto session = [state](tcp::socket socket) {
    std::int64_t unset = 0;
    state->first_connection_ns.compare_exchange_strong(
        unset, Clock::now().time_since_epoch() / std::chrono::nanoseconds(1));
    std::make_shared<Session>(std::move(socket), *state)->start();
  };
#ifdef _WIN32
  state->acceptor.async_accept(
      [state, session](const boost::system::error_code& ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
        if (ec) return pause_then_accept(state, ec);
        session(std::move(socket));
        accept_next(state);
      });
#else
  state->acceptor.async_wait(
      tcp::acceptor::wait_read, [state, session](const boost::system::error_code& ec) {
        if (ec == asio::error::operation_aborted || !state->acceptor.is_open()) return;
        if (ec) return pause_then_accept(state, ec);
        for (int taken = 0; taken < kAcceptBurst; ++taken) {
          boost::system::error_code accept_ec;
          tcp::socket socket = state->acceptor.accept(accept_ec);
          if (accept_ec == asio::error::would_block || accept_ec == asio::error::try_again) break;
          if (accept_ec == asio::error::connection_aborted) continue;  // the client gave up
          if (accept_ec) return pause_then_accept(state, accept_ec);
          session(std::move(socket));
        }
        accept_next(state);
      });
#endif
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const std::string& token,
                               const std::string& failed_line, const std::string& role)
    : state_(std::make_shared<State>()) {
  PARTRAIN_CHECK(token.size() <= kMaxTokenBytes, UsageError, "tcp store: run token longer than ",
                 kMaxTokenBytes, " bytes");
  state_->token = token;
  if (!failed_line.empty()) {
    state_->failed = answer_with_text(kStoreFailed, failed_line.substr(0, kMaxNoticeBytes));
  }
  const std::string about =
      store_accept_text(steady_clock_identity(), {role, encode_process_mark(this_process())});
  state_->accept = answer_with_text(kStoreAccept, about.substr(0, kMaxTokenBytes));
  net::raise_open_file_limit();  // one descriptor for each client
  boost::system::error_code ec;
  const asio::ip::address address = listen_address(host);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  // The wildcard of IPv6 also takes IPv4 clients, so a name that resolves either way works.
  if (!ec && address.is_v6() && address.is_unspecified()) {
    state_->acceptor.set_option(asio::ip::v6_only(false), ec);
  }
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(kListenBacklog, ec);
  // A port in use or an address not on this machine is a setting to change, not a failure
  // of the run: exit 2 with the address.
  PARTRAIN_CHECK(!ec, UsageError, "tcp store: cannot listen on ", net::join_host_port(host, port),
                 ": ", ec.message(), " (choose another --master-port or launch.rendezvous)");
  port_ = state_->acceptor.local_endpoint().port();
#ifndef _WIN32
  state_->acceptor.non_blocking(true);  // accept_next drains the queue until it would block
#endif
  accept_next(state_);
  thread_ = std::thread([state = state_] {
#ifdef _WIN32
    HANDLE self = nullptr;
    if (DuplicateHandle(GetCurrentProcess(), GetCurrentThread(), GetCurrentProcess(), &self, 0,
                        FALSE, DUPLICATE_SAME_ACCESS)) {
      state->io_thread.store(self);
    }
#endif
    state->io.run();
  });
}

TcpStoreServer::~TcpStoreServer() {
  state_->io.stop();
  if (thread_.joinable()) thread_.join();
  // The pending accept's handler holds the state, which owns the io context holding that
  // handler: a cycle that would leak both. Closing the acceptor and polling lets the handler
  // finish (aborted, without re-arming); sessions still queued go with the io context.
  boost::system::error_code ignored;
  state_->acceptor.close(ignored);
  state_->accept_pause.cancel();
  state_->io.restart();
  state_->io.poll();
}

std::uint64_t TcpStoreServer::requests_served() const {
  return state_->requests.load(std::memory_order_relaxed);
}

std::optional<std::chrono::steady_clock::time_point> TcpStoreServer::first_connection() const {
  const std::int64_t ns = state_->first_connection_ns.load();
  if (ns == 0) return std::nullopt;
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

std::optional<double> TcpStoreServer::cpu_seconds() const {
#ifdef _WIN32
  FILETIME created, exited, kernel, user;
  const HANDLE io_thread = state_->io_thread.load();  // null until the thread has started
  if (io_thread == nullptr || !GetThreadTimes(io_thread, &created, &exited, &kernel, &user)) {
    return std::nullopt;
  }
  const auto ticks = [](const FILETIME& t) {  // 100 ns each
    return (static_cast<std::uint64_t>(t.dwHighDateTime) << 32) | t.dwLowDateTime;
  };
  return static_cast<double>(ticks(kernel) + ticks(user)) / 1e7;
#else
  clockid_t clock = 0;
  timespec used{};
  if (pthread_getcpuclockid(const_cast<std::thread&>(thread_).native_handle(), &clock) != 0 ||
      clock_gettime(clock, &used) != 0) {
    return std::nullopt;
  }
  return static_cast<double>(used.tv_sec) + static_cast<double>(used.tv_nsec) / 1e9;
#endif
}

std::vector<std::string> TcpStoreServer::refused_clients() const {
  std::lock_guard<std::mutex> lock(state_->refused_mutex);
  return state_->refused;
}

std::vector<std::string> TcpStoreServer::notices() const {
  std::lock_guard<std::mutex> lock(state_->refused_mutex);
  return state_->notices;
}

std::uint64_t TcpStoreServer::told_clients() const { return state_->told.load(); }

std::optional<std::chrono::steady_clock::time_point> TcpStoreServer::last_heard() const {
  const std::int64_t ns = state_->last_heard_ns.load();
  if (ns == 0) return std::nullopt;
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

// ---- client ---------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, const StoreOptions& options)
    : timeout_(options.timeout), socket_(io_) {
  PARTRAIN_CHECK(options.token.size() <= kMaxTokenBytes, UsageError,
                 "tcp store: run token longer than ", kMaxTokenBytes, " bytes");
  PARTRAIN_CHECK(
      options.join_key.size() <= kMaxKeyBytes && options.join_value.size() <= kMaxJoinValueBytes,
      UsageError, "tcp store: a join's key of ", options.join_key.size(), " bytes or value of ",
      options.join_value.size(), " bytes is over the limits (", kMaxKeyBytes, ", ",
      kMaxJoinValueBytes, ")");
  port_ = port;
  if (options.host_server) {
    server_ = std::make_unique<TcpStoreServer>(host, port, options.token, "",
                                               "rank " + std::to_string(options.rank));
    port_ = server_->port();
  }
  endpoint_ = net::join_host_port(host, port_);
  const auto deadline = net::deadline_after(timeout());
  PARTRAIN_CHECK(net::connect_with_retry(io_, socket_, host, port_, deadline), CommError,
                 "tcp store: no server at ", endpoint_, " within ", timeout().count(), " ms");
  socket_.set_option(tcp::no_delay(true));
  // A key to set as it joins rides in the hello itself.
  const std::vector<std::uint8_t> hello =
      options.join_key.empty()
          ? opening(kStoreMagic, options.token)
          : opening(kStoreJoinMagic, bytes_as_text(store_join_payload(
                                         {options.token, options.join_key, options.join_value})));
  auto sent = net::write_all(io_, socket_, hello.data(), hello.size(), deadline);
  char answer[8] = {};
  auto got = sent.ok() ? net::read_exact(io_, socket_, answer, 8, deadline) : sent;
  PARTRAIN_CHECK(!got.ok() || std::memcmp(answer, kStoreRefuse, 8) != 0, UsageError,
                 "tcp store at ", endpoint_,
                 " belongs to another run: its run token differs from this one's (another job "
                 "uses this port, or this node's command differs from the master's: ",
                 kTokenSources,
                 "); use another --master-port, or the same command and token on every node");
  // The text after the answer's magic (answer_with_text()): u32 bytes, at most `limit`, then them.
  const auto text_of_answer = [&](std::uint32_t limit) {
    std::uint8_t length[4] = {};
    got = net::read_exact(io_, socket_, length, 4, deadline);
    const std::uint32_t bytes = got.ok() ? get_le<std::uint32_t>(length) : 0;
    PARTRAIN_CHECK(got.ok() && bytes <= limit, CommError, "tcp store at ", endpoint_,
                   ": a malformed answer to the hello: ", got.ok() ? "bad length" : got.message);
    std::vector<std::uint8_t> text(bytes);
    got = net::read_exact(io_, socket_, text.data(), bytes, deadline);
    PARTRAIN_CHECK(got.ok(), CommError, "tcp store at ", endpoint_,
                   ": a malformed answer to the hello: ", got.message);
    return text;
  };
  if (got.ok() && std::memcmp(answer, kStoreFailed, 8) == 0) {
    throw MasterStoppedError("the master at " + endpoint_ +
                             " says: " + notice_line(text_of_answer(kMaxNoticeBytes)));
  }
  PARTRAIN_CHECK(got.ok() && std::memcmp(answer, kStoreAccept, 8) == 0, CommError, "tcp store at ",
                 endpoint_, " refused this client (wrong run token, or not a partrain store): ",
                 got.ok() ? "bad answer" : got.message);
  const StoreAcceptText about =
      parse_store_accept_text(bytes_as_text(text_of_answer(kMaxTokenBytes)));
  const std::string mine = steady_clock_identity();
  same_clock_ = options.read_shared_clock_here && !mine.empty() && mine == about.clock;
  server_process_ = about.server;
}

TcpStore::~TcpStore() {
  boost::system::error_code ignored;
  socket_.close(ignored);
}

TcpStore::Answer TcpStore::request(StoreCommand command, const std::string& key,
                                   const std::vector<std::uint8_t>& value,
                                   std::chrono::milliseconds wait_ms) {
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
  // A wait's answer may take wait_ms by design; the round trip itself gets the store's bound.
  const auto deadline = net::deadline_after(timeout() + wait_ms);
  const Clock::time_point sent = Clock::now();
  auto result = net::write_all(io_, socket_, message.data(), message.size(), deadline);
  std::uint8_t header[kResponseBytes] = {};
  if (result.ok()) result = net::read_exact(io_, socket_, header, kResponseBytes, deadline);
  Answer answer;
  if (result.ok()) {
    const ServerClockReading reading{sent, Clock::now(), decode_i64(header + 5)};
    ++clock_readings_;
    if (!best_clock_ || reading.round_trip() < best_clock_->round_trip()) best_clock_ = reading;
    const std::uint32_t bytes = get_le<std::uint32_t>(header + 1);
    if (bytes > kMaxValueBytes || header[0] > static_cast<std::uint8_t>(StoreStatus::timed_out)) {
      result = {net::IoStatus::error, "malformed answer"};
    } else {
      answer.status = static_cast<StoreStatus>(header[0]);
      answer.value.resize(bytes);
      result = net::read_exact(io_, socket_, answer.value.data(), bytes, deadline);
    }
  }
  if (!result.ok()) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    throw CommError(
        "tcp store: request for key '" + key + "' to " + endpoint_ + " failed: " + result.message +
        (result.status == net::IoStatus::closed || result.status == net::IoStatus::timeout
             ? serving_process(server_process_, result.status == net::IoStatus::closed)
             : ""));
  }
  return answer;
}

void TcpStore::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  request(StoreCommand::set, key, value);
}

bool TcpStore::wait_for(const std::string& key, std::chrono::milliseconds timeout, bool wants_value,
                        std::vector<std::uint8_t>* value) {
  const auto ms = std::clamp<std::chrono::milliseconds::rep>(timeout.count(), 0, UINT32_MAX);
  std::vector<std::uint8_t> wait(kStoreWaitBytes);
  put_le<std::uint32_t>(wait.data(), static_cast<std::uint32_t>(ms));
  wait[4] = wants_value ? kStoreWaitWantsValue : 0;
  Answer answer = request(StoreCommand::wait, key, wait, std::chrono::milliseconds(ms));
  if (answer.status != StoreStatus::present) return false;
  if (value != nullptr) *value = std::move(answer.value);
  return true;
}

std::string TcpStore::refused_note() const {
  if (!server_) return "";
  std::string note;
  for (const auto& line : server_->notices()) note += "; meanwhile it was told: " + line;
  const std::vector<std::string> refused = server_->refused_clients();
  if (refused.empty()) return note;
  std::string from;
  for (const auto& address : refused) from += (from.empty() ? "" : ", ") + address;
  return note + "; meanwhile it refused partrain processes with another run's token, from " + from +
         " (a node whose command differs from this one's: " + kTokenSources +
         "; its own output says which)";
}

std::vector<std::string> TcpStore::notices() const {
  return server_ ? server_->notices() : std::vector<std::string>{};
}

std::vector<std::uint8_t> TcpStore::get(const std::string& key) {
  std::vector<std::uint8_t> value;
  PARTRAIN_CHECK(wait_for(key, timeout(), true, &value), CommError, "tcp store ", endpoint_,
                 ": key '", key, "' did not appear within ", timeout().count(), " ms",
                 refused_note());
  return value;
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  const Answer answer = request(StoreCommand::add, key, encode_i64(delta));
  PARTRAIN_CHECK(answer.status == StoreStatus::present && answer.value.size() == 8, CommError,
                 "tcp store: bad answer to add('", key, "')");
  return decode_i64(answer.value.data());
}

std::vector<std::vector<std::uint8_t>> TcpStore::get_many(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  const auto ms = std::clamp<std::chrono::milliseconds::rep>(timeout().count(), 0, UINT32_MAX);
  std::vector<std::uint8_t> value(8);
  put_le<std::uint32_t>(value.data(), static_cast<std::uint32_t>(ms));
  put_le<std::uint32_t>(value.data() + 4, static_cast<std::uint32_t>(keys.size() - 1));
  for (std::size_t i = 1; i < keys.size(); ++i) {
    PARTRAIN_CHECK(!keys[i].empty() && keys[i].size() <= kMaxKeyBytes, UsageError,
                   "tcp store: key must have 1 to ", kMaxKeyBytes, " bytes");
    std::uint8_t length[4];
    put_le<std::uint32_t>(length, static_cast<std::uint32_t>(keys[i].size()));
    value.insert(value.end(), length, length + 4);
    value.insert(value.end(), keys[i].begin(), keys[i].end());
  }
  const Answer answer =
      request(StoreCommand::get_many, keys[0], value, std::chrono::milliseconds(ms));
  const auto index = [&] {
    return answer.value.size() == 4 ? get_le<std::uint32_t>(answer.value.data()) : 0u;
  };
  PARTRAIN_CHECK(answer.status != StoreStatus::timed_out, CommError, "tcp store ", endpoint_,
                 ": key '", keys[std::min<std::size_t>(index(), keys.size() - 1)],
                 "' did not appear within ", timeout().count(), " ms", refused_note());
  PARTRAIN_CHECK(answer.status == StoreStatus::present, CommError, "tcp store ", endpoint_,
                 ": the values of ", keys.size(), " keys outgrow one answer (", kMaxValueBytes,
                 " bytes) at key '", keys[std::min<std::size_t>(index(), keys.size() - 1)], "'");
  std::vector<std::vector<std::uint8_t>> values;
  values.reserve(keys.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    PARTRAIN_CHECK(answer.value.size() - at >= 4, CommError, "tcp store ", endpoint_,
                   ": a malformed answer to get many");
    const std::uint32_t bytes = get_le<std::uint32_t>(answer.value.data() + at);
    at += 4;
    PARTRAIN_CHECK(answer.value.size() - at >= bytes, CommError, "tcp store ", endpoint_,
                   ": a malformed answer to get many");
    values.emplace_back(answer.value.begin() + static_cast<std::ptrdiff_t>(at),
                        answer.value.begin() + static_cast<std::ptrdiff_t>(at + bytes));
    at += bytes;
  }
  PARTRAIN_CHECK(at == answer.value.size(), CommError, "tcp store ", endpoint_,
                 ": a malformed answer to get many");
  return values;
}

std::optional<ServerClockReading> TcpStore::server_clock(int readings) {
  if (same_clock_) {  // the server's clock is this process's: read it here, exactly
    const Clock::time_point now = Clock::now();
    return ServerClockReading{now, now, steady_ns(now)};
  }
  // Each turn adds a reading (or throws): at most `readings` round trips.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);  // request() updates them under it
      if (clock_readings_ >= readings) return best_clock_;
    }
    const Answer answer = request(StoreCommand::clock, kStoreClockKey, {});
    PARTRAIN_CHECK(answer.status == StoreStatus::present && answer.value.empty(), CommError,
                   "tcp store ", endpoint_, ": a malformed answer to the clock request");
  }
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (request(StoreCommand::get, key, {}).status != StoreStatus::present) return false;
  }
  return true;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    PARTRAIN_CHECK(wait_for(key, std::max(left, std::chrono::milliseconds(0)), false, nullptr),
                   CommError, "tcp store ", endpoint_, ": key '", key, "' did not appear within ",
                   timeout.count(), " ms", refused_note());
  }
}

bool tell_tcp_store(const std::string& host, int port, const std::string& line,
                    std::chrono::milliseconds bound) {
  try {
    asio::io_context io;
    tcp::socket socket(io);
    const auto deadline = net::deadline_after(bound);
    if (!net::connect_with_retry(io, socket, host, port, deadline)) return false;
    const std::vector<std::uint8_t> hello =
        opening(kStoreNoticeMagic, line.substr(0, kMaxNoticeBytes));
    const auto sent = net::write_all(io, socket, hello.data(), hello.size(), deadline);
    char answer[8] = {};
    const auto got = sent.ok() ? net::read_exact(io, socket, answer, 8, deadline) : sent;
    return got.ok() && std::memcmp(answer, kStoreNoted, 8) == 0;
  } catch (const std::exception&) {
    return false;  // a name that does not resolve, say: nobody to tell
  }
}

}  // namespace partrain::comm
