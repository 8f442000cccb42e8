#include "trainer/observe/flight_recorder.h"

#include <algorithm>
#include <chrono>
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

// "allreduce #136 (step 68, bucket 2, 1.1 MB)"
std::string name_collective(const FlightEntry& e) {
  std::ostringstream text;
  text << flight_op_name(e.op) << " #" << e.seq << " (step " << e.step;
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

std::optional<FlightOp> op_from_name(const std::string& name) {
  for (FlightOp op : {FlightOp::kAllreduce, FlightOp::kStepExchange}) {
    if (flight_op_name(op) == name) return op;
  }
  return std::nullopt;
}

RankDump read_dump(const std::filesystem::path& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return UsageError(detail::concat(path.string(), ": ", why));
  };
  if (!j.is_object() || j.value("schema", "") != "partrain.flight/1") {
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
      const auto op = op_from_name(c.at("op").get<std::string>());
      if (!op) throw bad("unknown op '" + c.at("op").get<std::string>() + "'");
      e.op = *op;
      e.bucket = c.at("bucket").is_null() ? -1 : c.at("bucket").get<int>();
      e.bytes = c.at("bytes").get<std::uint64_t>();
      e.step = c.at("step").get<std::int64_t>();
      e.start_s = c.at("start_s").get<double>();
      e.end_s = c.at("end_s").is_null() ? -1 : c.at("end_s").get<double>();
      d.entries.push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  }
  std::sort(d.entries.begin(), d.entries.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
  return d;
}

}  // namespace

std::string_view flight_op_name(FlightOp op) {
  switch (op) {
    case FlightOp::kAllreduce:
      return "allreduce";
    case FlightOp::kStepExchange:
      return "step exchange";
  }
  return "collective";
}

std::uint64_t FlightRecorder::enter(FlightOp op, int bucket, std::size_t bytes) {
  const double now = unix_seconds_now();
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t seq = next_seq_++;
  FlightEntry& e = ring_[seq % kCapacity];
  e.seq = seq;
  e.op = op;
  e.bucket = bucket;
  e.bytes = bytes;
  e.step = step_.load(std::memory_order_relaxed);
  e.start_s = now;
  e.end_s = -1;
  return seq;
}

void FlightRecorder::leave(std::uint64_t seq) {
  const double now = unix_seconds_now();
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEntry& e = ring_[seq % kCapacity];
  if (e.seq == seq) e.end_s = now;  // else overwritten by 64 newer ones: nothing to mark
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::vector<FlightEntry> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FlightEntry& e : ring_) {
      if (e.seq != 0) out.push_back(e);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
  return out;
}

void FlightRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_ = {};
  next_seq_ = 1;
}

FlightRecorder& flight_recorder() {
  static FlightRecorder recorder;
  return recorder;
}

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
                           {"op", flight_op_name(e.op)},
                           {"bucket", e.bucket >= 0 ? Json(e.bucket) : Json(nullptr)},
                           {"bytes", e.bytes},
                           {"step", e.step},
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
    const std::uint64_t last = d.entries.empty() ? 0 : d.entries.back().seq;
    furthest = std::max(furthest, last);
    least = std::min(least, last);
  }
  // A rank that left no record (frozen, killed) is the first suspect: the others cannot get
  // past a collective it never joined. Among the ranks that wrote one, the furthest behind
  // held up those ahead of it.
  std::vector<int> behind, ahead;
  for (const auto& [rank, d] : dumps) {
    const std::uint64_t last = d.entries.empty() ? 0 : d.entries.back().seq;
    (last == least ? behind : ahead).push_back(rank);
  }
  const RankDump& b = dumps.at(behind.front());
  const std::string behind_at =
      b.entries.empty() ? std::string("no collective") : name_collective(b.entries.back());
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
    const RankDump* a = nullptr;  // a rank that entered the furthest collective
    for (const int r : ahead) {
      if (dumps.at(r).entries.back().seq == furthest) a = &dumps.at(r);
    }
    text << (missing.empty() ? ": " : "; ") << join_ranks(behind) << " stood at " << behind_at
         << ", " << join_ranks(ahead) << " had entered #" << furthest << " ("
         << flight_op_name(a->entries.back().op) << ")";
  }
  text << ".\n";
  return text.str();
}

}  // namespace partrain
