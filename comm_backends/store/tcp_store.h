// defines: TcpStore (client, optionally hosting the server) and TcpStoreServer — a small
// key-value server on Boost.Asio.
//
// Protocol (little-endian): the client opens with kStoreMagic, a version and its run token;
// the server answers kStoreAccept, then u32 bytes | what it says of itself
// (store_accept_text(): the identity of its steady clock, steady_clock_identity(), which a
// client that shares it reads itself; its process mark; whom it serves as), or
// kStoreRefuse for a wrong token, or kStoreFailed | u32 bytes | a line from a server that stands
// in for a master node that could not start (any token), or closes. A client that sets a key as
// it joins opens with kStoreJoinMagic instead, its token, key and value in the payload
// (store_join_payload()); the server answers it as a hello, having set the key. A client may
// open with kStoreNoticeMagic instead: the same version, then u32 bytes | a line of text (at most
// kMaxNoticeBytes), from a partrain process that could not join the run (tell_tcp_store()); the
// server keeps the line, says it on stderr, answers kStoreNoted and closes. Then each request is
//   u8 command | u32 key bytes | u32 value bytes | key | value
// with key and value sizes bounded (kMaxKeyBytes, kMaxValueBytes), and each answer
//   u8 status (0 absent, 1 present, 2 timed out) | u32 value bytes | u64 clock | value
// where clock is the server's steady clock in nanoseconds, read as the answer is sent: every
// round trip a client makes is also a reading of the server's clock.
// A client that breaks the protocol is disconnected. Commands: 1 set, 2 get (answers at once),
// 3 add, 4 wait: value = u32 timeout in ms | u8 flags (kStoreWaitWantsValue); the server
// answers when the key is set, or with status 2 when the timeout passes. So a rank waiting for
// a key costs one request and no polling, however long it waits. 5 get many: key = the first
// key, value = u32 timeout in ms | u32 n | n x (u32 bytes | key), the other keys; answered
// once every key is set with status 1 and (u32 bytes | value) for each key in order, or with
// status 2 and the u32 index of a key still missing when the timeout passes (status 0 and the
// index where the values would outgrow kMaxValueBytes). A leader gathering its group's keys
// waits one round trip, not one per key. 6 clock: key kStoreClockKey, no value; answered at
// once, with no value (a round trip for its clock reading alone).
//
// One io thread serves every connection asynchronously: a client that stops reading or
// writing holds only its own connection, and thousands of waiting clients cost a map entry
// each. The server raises its open-file limit to the hard limit (one descriptor a client).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "comm_backends/store/store.h"

namespace partrain::comm {

inline constexpr char kStoreMagic[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'E', '1'};
inline constexpr char kStoreAccept[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'O', 'K'};
// Sent, before closing, to a client whose hello was well formed but whose run token is not
// this store's: another job on the same port, which deserves to be told so.
inline constexpr char kStoreRefuse[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'N', 'O'};
// Sent instead of kStoreAccept, with u32 bytes | a line (at most kMaxNoticeBytes), by a server
// that stands in for a master node that could not start (TcpStoreServer's `failed_line`): the
// client stops with that line.
inline constexpr char kStoreFailed[8] = {'P', 'T', 'S', 'T', 'F', 'A', 'I', 'L'};
// The hello of a notice (tell_tcp_store()), and the server's answer that it has the line.
inline constexpr char kStoreNoticeMagic[8] = {'P', 'T', 'S', 'T', 'N', 'O', 'T', 'E'};
inline constexpr char kStoreNoted[8] = {'P', 'T', 'S', 'T', 'N', 'O', 'T', 'D'};
inline constexpr std::uint32_t kMaxNoticeBytes = 2048;
// The hello of a client that sets one key as it joins (StoreOptions::join_key): its payload is
// u32 token bytes | token | u32 key bytes | key | value, the value at most kMaxJoinValueBytes.
// The server checks the token as for a hello, sets the key, and answers as it answers a
// hello; the key costs no request and no round trip.
inline constexpr char kStoreJoinMagic[8] = {'P', 'T', 'S', 'T', 'J', 'O', 'I', 'N'};
inline constexpr std::uint32_t kMaxJoinValueBytes = 1024;
// 2: wait; 3: get many, clock; 4: the server's clock in every answer and its identity in the
// hello's; 5: the server's process and role in the hello's answer.
inline constexpr std::uint32_t kStoreProtocolVersion = 5;
inline constexpr std::uint32_t kMaxTokenBytes = 1024;
inline constexpr std::uint32_t kMaxKeyBytes = 4096;
inline constexpr std::uint32_t kMaxValueBytes = 64u << 20;

// The server's half of the protocol as pure functions over bytes, so it can be checked
// without sockets. A false answer means: drop the connection.
inline constexpr std::size_t kStoreHelloBytes = 16;     // magic, version, token length
inline constexpr std::size_t kStoreRequestBytes = 9;    // command, key length, value length
inline constexpr std::size_t kStoreResponseBytes = 13;  // status, value length, clock

// Checks the magic, version and token length of a hello; sets the token bytes to read next.
bool parse_store_hello(const std::uint8_t* hello, std::uint32_t& token_bytes);
// Checks the magic, version and length of a notice's hello; sets the text bytes to read next.
bool parse_store_notice(const std::uint8_t* hello, std::uint32_t& text_bytes);
// A notice's text as the server keeps and prints it: one line, control bytes as spaces.
std::string notice_line(const std::vector<std::uint8_t>& text);
// Checks the magic, version and length of a join's hello; sets the payload bytes to read next.
bool parse_store_join(const std::uint8_t* hello, std::uint32_t& payload_bytes);
// A join's payload, built and read back; nullopt for one that is not well formed.
struct StoreJoin {
  std::string token;
  std::string key;
  std::vector<std::uint8_t> value;
};
std::vector<std::uint8_t> store_join_payload(const StoreJoin& join);
std::optional<StoreJoin> parse_store_join_payload(const std::vector<std::uint8_t>& payload);

struct StoreRequestHeader {
  std::uint8_t command = 0;
  std::uint32_t key_bytes = 0;
  std::uint32_t value_bytes = 0;
};
// Checks the sizes a request announces before its body is read (and allocated).
bool parse_store_request(const std::uint8_t* header, StoreRequestHeader& request);

enum class StoreCommand : std::uint8_t {
  set = 1,
  get = 2,
  add = 3,
  wait = 4,
  get_many = 5,
  clock = 6
};
inline constexpr const char* kStoreClockKey = "clock";      // the clock command's (unused) key
inline constexpr std::size_t kStoreWaitBytes = 5;           // the wait command's value
inline constexpr std::uint8_t kStoreWaitWantsValue = 0x01;  // answer with the value too
enum class StoreStatus : std::uint8_t { absent = 0, present = 1, timed_out = 2 };

using StoreTable = std::map<std::string, std::vector<std::uint8_t>>;
// What serving a request came to: an answer to send, a wait to park until the keys are set
// (or its timeout passes), or a broken request (drop the connection).
enum class StoreServed { answer, wait, drop };
// A request parked until keys are set: a wait (one key) or a get many (every key, all
// answered at once).
struct StoreWait {
  std::uint32_t ms = 0;
  std::vector<std::string> keys;
  bool many = false;
  bool wants_value = false;  // a wait's flag
};
// Runs one request whose body (key then value) has arrived; with `answer`, `response` holds
// the whole answer (and `wait.keys` is left empty); with `wait`, `wait` what to wait for and
// how long.
StoreServed serve_store_request(StoreTable& table, const StoreRequestHeader& request,
                                const std::vector<std::uint8_t>& body,
                                std::vector<std::uint8_t>& response, StoreWait& wait);
// The answer to a wait whose key is now in the table (or, with a null value, timed out).
std::vector<std::uint8_t> store_wait_answer(const std::vector<std::uint8_t>* value, bool wants);
// The answer to a get many whose keys are all in the table.
std::vector<std::uint8_t> store_many_answer(const StoreTable& table,
                                            const std::vector<std::string>& keys);
// A get many's answer when the timeout passed with keys[missing] still absent.
std::vector<std::uint8_t> store_many_timed_out(std::size_t missing);
// The index of the first of `keys` not in the table, or keys.size() when all are.
std::size_t first_missing(const StoreTable& table, const std::vector<std::string>& keys,
                          std::size_t from = 0);

// What a server says of itself after kStoreAccept, one to a line: the identity of its steady
// clock, its process mark and whom it serves as (StoreServerProcess), at most kMaxTokenBytes in
// all; and back. A text of one line (a server that says no more) has no server process.
struct StoreAcceptText {
  std::string clock;
  std::optional<StoreServerProcess> server;
};
std::string store_accept_text(const std::string& clock, const StoreServerProcess& server);
StoreAcceptText parse_store_accept_text(std::string_view text);

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port) until destroyed. With a `failed_line` it
  // serves nobody: it stands in for a master node that could not start its ranks (Note [A node
  // that could not start] in cli/run_command.cpp), and answers every well-formed hello, whatever
  // its token, with kStoreFailed and that line, on which the client stops.
  // `role` is whom it serves as ("rank 0"), told to every client with this process's mark
  // (StoreServerProcess).
  TcpStoreServer(const std::string& host, int port, const std::string& token,
                 const std::string& failed_line = {}, const std::string& role = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Requests answered so far (hellos not counted), and when the first client connected.
  std::uint64_t requests_served() const;
  std::optional<std::chrono::steady_clock::time_point> first_connection() const;
  // CPU seconds the server's one thread has used, where the platform can tell.
  std::optional<double> cpu_seconds() const;
  // The addresses of partrain clients refused for another run's token (the first
  // kRefusedNamed of them, each once), in the order they came. Each was also told on stderr
  // as it came: the node it is on stopped at once, while this run's ranks wait for it.
  std::vector<std::string> refused_clients() const;
  static constexpr std::size_t kRefusedNamed = 8;
  // The lines partrain processes that could not join told this server (tell_tcp_store()), the
  // first kNoticesKept of them, in the order they came; each was also said on stderr.
  std::vector<std::string> notices() const;
  static constexpr std::size_t kNoticesKept = 8;
  // A stand-in (`failed_line`): the clients told that line so far, and when the last of them,
  // or of the processes that sent a notice, came (nullopt: none yet).
  std::uint64_t told_clients() const;
  std::optional<std::chrono::steady_clock::time_point> last_heard() const;

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
  std::vector<std::vector<std::uint8_t>> get_many(const std::vector<std::string>& keys) override;
  std::optional<ServerClockReading> server_clock(int readings) override;
  std::vector<std::string> notices() const override;
  std::optional<StoreServerProcess> server_process() const override { return server_process_; }
  std::chrono::milliseconds timeout() const override { return timeout_.load(); }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  int port() const { return port_; }
  const TcpStoreServer* server() const { return server_.get(); }  // null unless hosted here

 private:
  struct Answer {
    StoreStatus status = StoreStatus::absent;
    std::vector<std::uint8_t> value;
  };
  // `wait_ms`: how long the server may hold the answer (wait); the client allows that much
  // more than its own bound on the round trip.
  Answer request(StoreCommand command, const std::string& key,
                 const std::vector<std::uint8_t>& value, std::chrono::milliseconds wait_ms = {});
  // Where this store hosts the server and it refused a client for another run's token, or was
  // told by one that could not join: why a key may never come, for the end of a timeout's
  // message ("" otherwise).
  std::string refused_note() const;
  // One wait request: true when the key is there, false when `timeout` passed first.
  bool wait_for(const std::string& key, std::chrono::milliseconds timeout, bool wants_value,
                std::vector<std::uint8_t>* value);

  std::unique_ptr<TcpStoreServer> server_;
  std::string endpoint_;
  int port_ = 0;
  // Atomic: a thread beside the one that sets it may make a request (a stop in the start-up
  // telling the others, StopRequest).
  std::atomic<std::chrono::milliseconds> timeout_;
  std::mutex mutex_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  std::optional<StoreServerProcess> server_process_;  // as the server said at the hello
  bool same_clock_ = false;                           // the server reads this process's clock
  int clock_readings_ = 0;                            // answers received so far
  std::optional<ServerClockReading> best_clock_;      // the one with the shortest round trip
};

// Tells the tcp store server at host:port, which needs no run token for it, one line from a
// partrain process that could not join the run: a node of a multi-node `partrain run` whose
// config it could not read cannot derive the run's token, and the server's ranks would
// otherwise wait for it until their timeout. Connects (retrying while nothing listens yet),
// sends and waits for the server's answer within `bound`; true where the server has the line.
// Never throws.
bool tell_tcp_store(const std::string& host, int port, const std::string& line,
                    std::chrono::milliseconds bound);

}  // namespace partrain::comm
