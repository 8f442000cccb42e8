// The rules are in engine_env.h; this file applies them.
#include "cli/engine_env.h"

// clang-format off
// Standard headers first: Boost 1.74's Asio uses std::exchange (C++20) without including it.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
// clang-format on

#include "common/errors.h"
#include "common/hash.h"

namespace partrain::cli {
namespace {

std::optional<int> env_int(const EnvLookup& env, const std::string& name) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PARTRAIN_CHECK(used == text->size() && value >= INT32_MIN && value <= INT32_MAX, UsageError,
                 "environment variable ", name, "='", *text, "' is not an integer");
  return static_cast<int>(value);
}

int env_int_or(const EnvLookup& env, const std::string& name, int fallback) {
  return env_int(env, name).value_or(fallback);
}

int port_from(const EnvLookup& env, const std::string& name) {
  const int port = *env_int(env, name);
  PARTRAIN_CHECK(port >= 1 && port <= 65535, UsageError, "environment variable ", name, "=", port,
                 " is not a port (1..65535)");
  return port;
}

std::string host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool is_loopback(const std::string& address) {
  boost::system::error_code ec;
  const auto parsed = boost::asio::ip::make_address(address, ec);
  return !ec && parsed.is_loopback();
}

// Who this process is; the engine decides which variables count.
void read_ranks(const EnvLookup& env, EngineRank& r) {
  if (env("RANK") || env("WORLD_SIZE")) {
    // torchrun first: a PARTRAIN_RUN_TOKEN exported for every node is no sign of partrain run.
    r.engine = env("TORCHELASTIC_RUN_ID") || env("TORCHELASTIC_RESTART_COUNT") ? Engine::torchrun
               : env("PARTRAIN_RENDEZVOUS") || env("PARTRAIN_RUN_TOKEN")       ? Engine::partrain
                                                                               : Engine::env;
    r.rank = env_int_or(env, "RANK", 0);
    r.world_size = env_int_or(env, "WORLD_SIZE", 1);
    r.local_rank = env_int_or(env, "LOCAL_RANK", r.rank);
    r.local_world_size = env_int_or(env, "LOCAL_WORLD_SIZE", r.world_size);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    r.engine = Engine::mpirun;
    r.rank = *env_int(env, "OMPI_COMM_WORLD_RANK");
    r.world_size = env_int_or(env, "OMPI_COMM_WORLD_SIZE", 1);
    r.local_rank = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    r.local_world_size = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("SLURM_PROCID") && env("SLURM_STEP_ID")) {
    r.engine = Engine::slurm;
    r.rank = *env_int(env, "SLURM_PROCID");
    r.world_size =
        env_int(env, "SLURM_STEP_NUM_TASKS").value_or(env_int_or(env, "SLURM_NTASKS", 1));
    r.local_rank = env_int_or(env, "SLURM_LOCALID", 0);
    const char* per_node_name =
        env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    if (const auto per_node = env(per_node_name)) {
      const auto counts = expand_slurm_tasks_per_node(*per_node, per_node_name);
      const int node = env_int_or(env, "SLURM_NODEID", 0);
      PARTRAIN_CHECK(node >= 0 && node < static_cast<int>(counts.size()), UsageError,
                     "SLURM_NODEID=", node, " has no entry in ", per_node_name, "='", *per_node,
                     "'");
      r.local_world_size = counts[node];
    } else {
      r.local_world_size = r.world_size;
    }
  }
  PARTRAIN_CHECK(r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size, UsageError, "rank ",
                 r.rank, " is outside a world of size ", r.world_size, " (from ",
                 engine_name(r.engine), "'s variables)");
  PARTRAIN_CHECK(r.local_world_size >= 1 && r.local_rank >= 0 && r.local_rank < r.local_world_size,
                 UsageError, "local rank ", r.local_rank, " is outside a node of ",
                 r.local_world_size, " ranks (from ", engine_name(r.engine), "'s variables)");
}

// Rule 3 of engine_env.h; nullopt without MASTER_ADDR and MASTER_PORT.
std::optional<std::string> master_rendezvous(const EnvLookup& env, EngineRank& r) {
  const auto addr = env("MASTER_ADDR");
  if (!addr || !env("MASTER_PORT")) return std::nullopt;
  int port = port_from(env, "MASTER_PORT");
  r.rendezvous_from = "MASTER_ADDR and MASTER_PORT";
  if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    PARTRAIN_CHECK(port < 65535, UsageError, "MASTER_PORT=65535 leaves no port for partrain's ",
                   "store beside torchrun's (it takes MASTER_PORT + 1)");
    ++port;
    r.rendezvous_from = "MASTER_ADDR and MASTER_PORT + 1 (torchrun's store holds MASTER_PORT)";
  }
  return "tcp://" + host_port(*addr, port);
}

// Rule 4 of engine_env.h.
std::string slurm_rendezvous(const EnvLookup& env, const HostResolver& resolve, EngineRank& r) {
  const char* list_name = env("SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                          : env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                      : "SLURM_NODELIST";
  std::string host;
  std::size_t hosts = 1;
  if (const auto addr = env("MASTER_ADDR")) {
    host = *addr;
    r.rendezvous_from = "MASTER_ADDR";
  } else {
    const auto list = env(list_name);
    PARTRAIN_CHECK(list.has_value(), UsageError, "srun set no SLURM_STEP_NODELIST or ",
                   "SLURM_JOB_NODELIST to find rank 0's host in; set MASTER_ADDR or ",
                   "launch.rendezvous");
    const auto names = expand_slurm_hostlist(*list, list_name);
    hosts = names.size();
    const std::string what = std::string(list_name) + "'s first host '" + names.front() + "'";
    host = resolve(names.front(), what);
    PARTRAIN_CHECK(hosts == 1 || !is_loopback(host), UsageError, what, " resolves to ", host,
                   " on this node, a loopback address the other nodes cannot reach; set ",
                   "MASTER_ADDR to its network address (or launch.rendezvous)");
    r.rendezvous_from = std::string("the first host of ") + list_name;
  }
  int port = 0;
  if (env("MASTER_PORT")) {
    port = port_from(env, "MASTER_PORT");
    r.rendezvous_from += " and MASTER_PORT";
  } else {
    const auto job = env_int(env, "SLURM_JOB_ID");
    PARTRAIN_CHECK(job.has_value() && *job >= 0, UsageError, "srun set no SLURM_JOB_ID to derive ",
                   "the rendezvous port from; set MASTER_PORT or launch.rendezvous");
    port = kSlurmPortBase + *job % kSlurmPortSpan;
    r.rendezvous_from += " and a port from SLURM_JOB_ID";
  }
  return "tcp://" + host_port(host, port);
}

// Fields separated by a byte none of them contains, so ("ab","c") and ("a","bc") differ.
std::string hash_fields(const std::string& kind, const std::vector<std::string>& fields) {
  std::string shared = kind;
  for (const std::string& field : fields) {
    shared += '\0';
    shared += field;
  }
  return fnv1a_128_hex(shared);
}

std::string engine_run_id(const EnvLookup& env, const EngineRank& r) {
  std::string run_id;
  switch (r.engine) {
    case Engine::torchrun:
      run_id = env("TORCHELASTIC_RUN_ID").value_or("");
      break;
    case Engine::mpirun:
      run_id = env("OMPI_MCA_ess_base_jobid").value_or(env("PMIX_NAMESPACE").value_or(""));
      break;
    case Engine::slurm:
      run_id = env("SLURM_JOB_ID").value_or("") + "." + env("SLURM_STEP_ID").value_or("");
      break;
    default:
      break;
  }
  return run_id;
}

std::string derive_token(const EnvLookup& env, const EngineRank& r) {
  return hash_fields("partrain-engine-token", {engine_name(r.engine), engine_run_id(env, r),
                                               r.rendezvous, std::to_string(r.world_size)});
}

// torchrun with a dynamic rendezvous (--rdzv_backend=c10d, etcd): every rendezvous round
// picks a fresh MASTER_PORT, and a node that joins later counts its restarts from 0 while
// the others do not. Only under the static rendezvous (torchrun's own store on MASTER_PORT)
// do all nodes restart in step on the same port.
bool torchrun_dynamic(const EnvLookup& env, const EngineRank& r) {
  return r.engine == Engine::torchrun && env("TORCHELASTIC_USE_AGENT_STORE").value_or("") != "True";
}

}  // namespace

std::string engine_name(Engine engine) {
  switch (engine) {
    case Engine::none:
      return "no engine";
    case Engine::partrain:
      return "partrain run";
    case Engine::torchrun:
      return "torchrun";
    case Engine::env:
      return "RANK/WORLD_SIZE";
    case Engine::mpirun:
      return "mpirun";
    case Engine::slurm:
      return "srun";
  }
  return "?";
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

std::string resolve_host(const std::string& host, const std::string& what) {
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  if (!ec) return host;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  const auto results = resolver.resolve(host, "", ec);
  PARTRAIN_CHECK(!ec && !results.empty(), UsageError, what,
                 " does not resolve to an address: ", ec ? ec.message() : "no addresses");
  for (const auto& entry : results) {
    if (entry.endpoint().address().is_v4()) return entry.endpoint().address().to_string();
  }
  return results.begin()->endpoint().address().to_string();
}

EngineRank read_engine_rank(const EnvLookup& env, const std::string& configured_rendezvous,
                            const HostResolver& resolve) {
  EngineRank r;
  read_ranks(env, r);

  if (const auto url = env("PARTRAIN_RENDEZVOUS")) {
    r.rendezvous = *url;
    r.rendezvous_from = "PARTRAIN_RENDEZVOUS";
  } else if (!configured_rendezvous.empty()) {
    r.rendezvous = configured_rendezvous;
    r.rendezvous_from = "the configured rendezvous";
    if (configured_rendezvous == "env://") {
      if (auto url = master_rendezvous(env, r)) r.rendezvous = *url;
    }
  } else if (auto url = master_rendezvous(env, r)) {
    r.rendezvous = *url;
  } else if (r.engine == Engine::slurm) {
    r.rendezvous = slurm_rendezvous(env, resolve, r);
  }

  switch (r.engine) {
    case Engine::torchrun:
      r.restart = env_int_or(env, "TORCHELASTIC_RESTART_COUNT", 0);
      break;
    case Engine::slurm:
      r.restart = env_int_or(env, "SLURM_RESTART_COUNT", 0);
      break;
    default:
      r.restart = env_int_or(env, "PARTRAIN_RESTART", 0);
      break;
  }
  PARTRAIN_CHECK(r.restart >= 0, UsageError, "a negative restart count (", r.restart, ")");
  const auto secret = env("PARTRAIN_RUN_TOKEN");
  if (secret) {
    r.token = *secret;
  } else if (r.engine != Engine::none) {
    r.token = derive_token(env, r);
  }
  r.lock_token = r.token;
  // Each start of a restarted group is a run of its own to the store and the ring: keys and
  // connections of the start before must not be mistaken for this one's. A dynamic round is
  // told apart by its rendezvous (a fresh port) and world, which all its nodes share.
  // The output lock outlives rounds and their world sizes: the rendezvous id names the run.
  if (torchrun_dynamic(env, r) && secret) {
    r.token +=
        ".round-" + hash_fields("partrain-round", {r.rendezvous, std::to_string(r.world_size)});
  } else if (torchrun_dynamic(env, r)) {
    r.lock_token =
        hash_fields("partrain-engine-lock", {engine_name(r.engine), engine_run_id(env, r)});
  } else if (r.restart > 0) {
    r.token += ".restart" + std::to_string(r.restart);
  }
  return r;
}

// ---- Slurm formats --------------------------------------------------------------------------

namespace {

struct Piece {  // one alternative inside a bracket: a number or a range, zero padded
  std::uint64_t low = 0, high = 0;
  std::size_t width = 0;  // digits to pad to; 0: no padding
};

std::uint64_t parse_number(const std::string& text, const std::string& what,
                           const std::string& list) {
  PARTRAIN_CHECK(!text.empty() && text.size() <= 18 &&
                     text.find_first_not_of("0123456789") == std::string::npos,
                 UsageError, what, "='", list, "': '", text, "' in brackets is not a number");
  return std::stoull(text);
}

std::vector<Piece> parse_bracket(const std::string& inside, const std::string& what,
                                 const std::string& list) {
  std::vector<Piece> pieces;
  std::stringstream in(inside);
  std::string part;
  while (std::getline(in, part, ',')) {
    Piece p;
    const auto dash = part.find('-');
    const std::string low = part.substr(0, dash);
    p.low = parse_number(low, what, list);
    p.high = dash == std::string::npos ? p.low : parse_number(part.substr(dash + 1), what, list);
    PARTRAIN_CHECK(p.low <= p.high, UsageError, what, "='", list, "': range '", part,
                   "' runs backwards");
    p.width = low.size() > 1 && low.front() == '0' ? low.size() : 0;
    // Slurm pads "[8-10]" to the width of the first bound only when it has a leading zero;
    // "[08-10]" -> 08 09 10.
    if (p.width == 0 && dash != std::string::npos) {
      const std::string high = part.substr(dash + 1);
      if (low.size() == high.size() && low.size() > 1) p.width = low.size();
    }
    pieces.push_back(p);
  }
  PARTRAIN_CHECK(!pieces.empty() && inside.back() != ',', UsageError, what, "='", list,
                 "': empty entry in brackets");
  return pieces;
}

std::string padded(std::uint64_t value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list, const std::string& what,
                                               std::size_t max_hosts) {
  std::vector<std::string> hosts;
  std::size_t at = 0;
  PARTRAIN_CHECK(!list.empty(), UsageError, what, " is empty");
  while (at <= list.size()) {
    // One name: text and bracket groups up to a comma outside brackets.
    std::vector<std::string> names{""};
    bool any = false;
    while (at < list.size() && list[at] != ',') {
      any = true;
      if (list[at] == '[') {
        const auto close = list.find(']', at);
        PARTRAIN_CHECK(close != std::string::npos, UsageError, what, "='", list,
                       "': '[' at offset ", at, " is never closed");
        const std::string inside = list.substr(at + 1, close - at - 1);
        PARTRAIN_CHECK(inside.find('[') == std::string::npos, UsageError, what, "='", list,
                       "': nested '[' at offset ", at);
        PARTRAIN_CHECK(!inside.empty(), UsageError, what, "='", list, "': empty '[]' at offset ",
                       at);
        const auto pieces = parse_bracket(inside, what, list);
        std::uint64_t count = 0;  // at most max_hosts, so that the sum cannot wrap
        for (const auto& p : pieces) {
          PARTRAIN_CHECK(p.high - p.low < max_hosts - count, UsageError, what, "='", list,
                         "' names more than ", max_hosts, " hosts");
          count += p.high - p.low + 1;
        }
        PARTRAIN_CHECK(names.size() * count + hosts.size() <= max_hosts, UsageError, what, "='",
                       list, "' names more than ", max_hosts, " hosts");
        std::vector<std::string> grown;
        grown.reserve(names.size() * count);
        for (const auto& prefix : names) {
          for (const auto& p : pieces) {
            for (std::uint64_t v = p.low; v <= p.high; ++v)
              grown.push_back(prefix + padded(v, p.width));
          }
        }
        names = std::move(grown);
        at = close + 1;
      } else {
        PARTRAIN_CHECK(list[at] != ']', UsageError, what, "='", list, "': ']' at offset ", at,
                       " without '['");
        for (auto& name : names) name += list[at];
        ++at;
      }
    }
    PARTRAIN_CHECK(any, UsageError, what, "='", list, "': empty host name at offset ", at);
    hosts.insert(hosts.end(), names.begin(), names.end());
    PARTRAIN_CHECK(hosts.size() <= max_hosts, UsageError, what, "='", list, "' names more than ",
                   max_hosts, " hosts");
    ++at;  // past the comma (or the end)
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& text, const std::string& what) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string part;
  auto bad = [&] { return UsageError(what + "='" + text + "' is not like '2(x3),1'"); };
  if (text.empty() || text.back() == ',') throw bad();
  while (std::getline(in, part, ',')) {
    std::size_t used = 0;
    int tasks = 0, repeat = 1;
    try {
      tasks = std::stoi(part, &used);
    } catch (const std::exception&) {
      throw bad();
    }
    if (used != part.size()) {
      if (part.compare(used, 2, "(x") != 0 || part.back() != ')') throw bad();
      const std::string times = part.substr(used + 2, part.size() - used - 3);
      std::size_t times_used = 0;
      try {
        repeat = std::stoi(times, &times_used);
      } catch (const std::exception&) {
        throw bad();
      }
      if (times_used != times.size()) throw bad();
    }
    if (tasks < 0 || repeat < 1 || counts.size() + repeat > (1u << 20)) throw bad();
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), tasks);
  }
  if (counts.empty()) throw bad();
  return counts;
}

}  // namespace partrain::cli
