#include "trainer/observe/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[32];
  if (bytes >= 1000 * 1000) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", static_cast<double>(bytes) / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

// "allreduce #136 (step 68, bucket 2, 1.1 MB)"; a collective of a communicator other than
// the first names it.
std::string name_collective(const FlightEntry& e) {
  std::ostringstream text;
  text << e.op_name() << " #" << e.seq << " (step " << e.step;
  if (e.comm > 1) text << ", communicator " << e.comm;
  if (e.bucket >= 0) text << ", bucket " << e.bucket;
  text << ", " << format_bytes(e.bytes) << ")";
  return text.str();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream text;
  text << (ranks.size() > 1 ? "ranks " : "rank ");
  for (std::size_t i = 0; i < ranks.size(); ++i) text << (i > 0 ? ", " : "") << ranks[i];
  return text.str();
}

struct RankDump {
  int world_size = 0;
  std::string error;
  double written_s = 0;
  std::vector<FlightEntry> entries;
};

// What the "op" of a dump's entry stands for: a collective's kind, or the step exchange.
bool op_from_name(const std::string& name, FlightEntry& e) {
  if (name == "step exchange") {
    e.kind = comm::CollectiveKind::allreduce;
    e.op = FlightOp::kStepExchange;
    return true;
  }
  for (auto kind : {comm::CollectiveKind::allreduce, comm::CollectiveKind::broadcast,
                    comm::CollectiveKind::allgather, comm::CollectiveKind::barrier,
                    comm::CollectiveKind::reduce_scatter}) {
    if (comm::collective_kind_name(kind) == name) {
      e.kind = kind;
      return true;
    }
  }
  return false;
}

RankDump read_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return UsageError(detail::concat(path.string(), ": ", why));
  };
  if (!j.is_object() || !j.contains("schema") || j["schema"] != "partrain.flight/1") {
    throw bad("not a partrain flight record (schema partrain.flight/1)");
  }
  RankDump d;
  try {
    d.world_size = j.at("world_size").get<int>();
    d.error = j.value("error", "");
    d.written_s = j.at("written_s").get<double>();
    for (const auto& c : j.at("collectives")) {
      FlightEntry e;
      e.seq = c.at("seq").get<std::uint64_t>();
      e.order = d.entries.size() + 1;
      e.comm = c.value("comm", 1);
      if (!op_from_name(c.at("op").get<std::string>(), e)) {
        throw bad("unknown op '" + c.at("op").get<std::string>() + "'");
      }
      e.bucket = c.at("bucket").is_null() ? -1 : c.at("bucket").get<int>();
      e.bytes = c.at("bytes").get<std::uint64_t>();
      e.step = c.at("step").get<std::int64_t>();
      if (c.contains("algorithm") && c.at("algorithm").is_string()) {
        const std::string name = c.at("algorithm").get<std::string>();
        name.copy(e.algorithm.data(), std::min(name.size(), e.algorithm.size() - 1));
      }
      e.start_s = c.at("start_s").get<double>();
      e.end_s = c.at("end_s").is_null() ? -1 : c.at("end_s").get<double>();
      d.entries.push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  }
  return d;
}

// Where a rank stood among the collectives of communicator `comm`: its last entry there.
const FlightEntry* last_of(const RankDump& d, int comm) {
  for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
    if (it->comm == comm) return &*it;
  }
  return nullptr;
}

}  // namespace

std::string describe_flight(const std::vector<FlightEntry>& entries, double now_s) {
  if (entries.empty()) return "no collective recorded";
  const FlightEntry& last = entries.back();
  if (last.end_s < 0) {
    return "in " + name_collective(last) + " for " + format_seconds(now_s - last.start_s);
  }
  return "after " + name_collective(last) + ", " + format_seconds(now_s - last.end_s) + " ago";
}

std::string dump_flight(const std::string& output_dir, int rank, int world_size,
                        std::string_view error, const std::vector<FlightEntry>& entries) {
  Json collectives = Json::array();
  for (const FlightEntry& e : entries) {
    collectives.push_back({{"seq", e.seq},
                           {"comm", e.comm},
                           {"op", e.op_name()},
                           {"bucket", e.bucket >= 0 ? Json(e.bucket) : Json(nullptr)},
                           {"bytes", e.bytes},
                           {"step", e.step},
                           {"algorithm", e.end_s >= 0 ? Json(e.algorithm_name()) : Json(nullptr)},
                           {"start_s", e.start_s},
                           {"end_s", e.end_s >= 0 ? Json(e.end_s) : Json(nullptr)}});
  }
  const Json doc{{"schema", "partrain.flight/1"},   {"rank", rank},
                 {"world_size", world_size},        {"error", std::string(error)},
                 {"written_s", unix_seconds_now()}, {"collectives", collectives}};
  const std::string dir = output_dir + "/flight";
  const std::string path = dir + "/rank-" + std::to_string(rank) + ".json";
  try {
    std::filesystem::create_directories(dir);
    write_file_atomically(path, doc.dump(1) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "partrain: cannot write the flight record %s: %s\n", path.c_str(),
                 e.what());
    return "";
  }
  return path;
}

std::string explain_flight(const std::string& dir) {
  std::map<int, RankDump> dumps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    char tail = 0;
    if (std::sscanf(name.c_str(), "rank-%d.jso%c", &rank, &tail) != 2 || tail != 'n') continue;
    if (name != "rank-" + std::to_string(rank) + ".json") continue;
    dumps[rank] = read_dump(entry.path());
  }
  PARTRAIN_CHECK(!ec, UsageError, "cannot read the folder ", dir, ": ", ec.message());
  PARTRAIN_CHECK(!dumps.empty(), UsageError, dir,
                 " holds no flight record (rank-R.json; a failed run writes OUTPUT/flight/)");
  int world = 0;
  for (const auto& [rank, d] : dumps) world = std::max({world, d.world_size, rank + 1});
  PARTRAIN_CHECK(world <= (1 << 20), UsageError, dir, ": world size ", world, " is not plausible");

  std::ostringstream text;
  text << "Flight records (" << dumps.size() << " of " << world << " ranks), the last "
       << FlightRecorder::kCapacity << " collectives of each:\n";
  // The ranks are compared on one communicator: the first one every dump has entries of
  // (the trainer's main one, made first), or else the one of rank 0's last entry.
  int comm = 0;
  for (const auto& [rank, d] : dumps) {
    for (const FlightEntry& e : d.entries) {
      if (comm != 0 && e.comm >= comm) continue;
      bool everywhere = true;
      for (const auto& [other, o] : dumps) everywhere &= last_of(o, e.comm) != nullptr;
      if (everywhere) comm = e.comm;
    }
  }
  if (comm == 0 && !dumps.begin()->second.entries.empty()) {
    comm = dumps.begin()->second.entries.back().comm;
  }
  const auto position = [comm](const RankDump& d) -> std::uint64_t {
    const FlightEntry* e = last_of(d, comm);
    return e == nullptr ? 0 : e->seq;
  };
  std::vector<int> missing;
  std::uint64_t furthest = 0;
  std::uint64_t least = UINT64_MAX;
  for (int r = 0; r < world; ++r) {
    const auto it = dumps.find(r);
    if (it == dumps.end()) {
      missing.push_back(r);
      text << "  rank " << r << ": no record (killed or frozen before it could write one)\n";
      continue;
    }
    const RankDump& d = it->second;
    text << "  rank " << r << ": " << describe_flight(d.entries, d.written_s);
    if (!d.error.empty()) text << "; " << d.error;
    text << "\n";
    furthest = std::max(furthest, position(d));
    least = std::min(least, position(d));
  }
  // A rank that left no record (frozen, killed) is the first suspect: the others cannot get
  // past a collective it never joined. Among the ranks that wrote one, the furthest behind
  // held up those ahead of it.
  std::vector<int> behind, ahead;
  for (const auto& [rank, d] : dumps) (position(d) == least ? behind : ahead).push_back(rank);
  const FlightEntry* b = last_of(dumps.at(behind.front()), comm);
  const std::string behind_at = b == nullptr ? std::string("no collective") : name_collective(*b);
  if (!missing.empty()) {
    text << "The others waited for " << join_ranks(missing)
         << ", which left no record (frozen or killed)";
    if (least == furthest) text << ": " << join_ranks(behind) << " stood at " << behind_at;
  } else if (least < furthest) {
    std::string who = join_ranks(behind);
    who[0] = 'R';
    text << who << " held the others up";
  } else {
    text << "Every rank stood at the same collective (#" << furthest << ")";
  }
  if (least < furthest) {
    const FlightEntry* a = nullptr;  // where a rank that entered the furthest collective stood
    for (const int r : ahead) {
      if (position(dumps.at(r)) == furthest) a = last_of(dumps.at(r), comm);
    }
    text << (missing.empty() ? ": " : "; ") << join_ranks(behind) << " stood at " << behind_at
         << ", " << join_ranks(ahead) << " had entered #" << furthest << " (" << a->op_name()
         << ")";
  }
  text << ".\n";
  return text.str();
}

}  // namespace partrain
