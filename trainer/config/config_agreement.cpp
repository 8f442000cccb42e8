#include "trainer/config/config_agreement.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "comm_backends/store/store.h"
#include "comm_backends/store/store_barrier.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/heartbeat.h"
#include "common/host_name.h"

namespace partrain {

namespace {

using Json = nlohmann::json;

// The keys that may differ between ranks (config_agreement.h says why), as JSON pointers.
constexpr const char* kPerHostKeys[] = {
    "/launch/bind",   "/comm/host",        "/comm/interface", "/comm/timeout_s", "/data/root",
    "/data/download", "/data/num_workers", "/train/threads",  "/output",         "/reference",
};

// "/train/optimizer/lr" -> "train.optimizer.lr".
std::string dotted(const std::string& pointer) {
  if (pointer.empty()) return "the config as a whole";
  std::string out = pointer.substr(1);
  std::replace(out.begin(), out.end(), '/', '.');
  return out;
}

// The TorchScript model file as ranks must agree on it: its bytes (each host may keep it under
// a path of its own), or its path where it cannot be read (loading it will say why).
std::string model_file_identity(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return path;
  return "a file of hash " + std::to_string(fnv1a_64_of(in));
}

}  // namespace

std::string agreement_json(const Config& config) {
  Json j = Json::parse(config_to_json(config));
  for (const char* key : kPerHostKeys) {
    const Json::json_pointer pointer(key);
    if (j.contains(pointer)) j[pointer.parent_pointer()].erase(pointer.back());
  }
  if (config.data.global_batch_size > 0) j["data"].erase("batch_size");
  // A path may differ where ranks load the same bytes from it; auto and a path may not (each
  // rank finds its shards by its own).
  if (!config.model.torchscript.empty()) {
    j["model"]["torchscript"] = model_file_identity(config.model.torchscript);
  }
  Json& resume = j["checkpoint"]["resume"];
  if (resume.is_string() && resume != "never" && resume != "auto") resume = "a path";
  return j.dump();
}

std::string config_differences(const std::string& mine, int me, const std::string& theirs,
                               int other) {
  if (mine == theirs) return "";
  Json a, b;
  try {
    a = Json::parse(mine).flatten();
    b = Json::parse(theirs).flatten();
  } catch (const Json::exception&) {  // the other rank's text is not JSON: another program
    return "its config cannot be compared key by key with rank " + std::to_string(other) + "'s";
  }
  std::set<std::string> keys;
  for (const Json* flat : {&a, &b}) {
    for (const auto& item : flat->items()) keys.insert(item.key());
  }
  auto value_in = [](const Json& flat, const std::string& key) {
    return flat.contains(key) ? flat.at(key).dump() : std::string("absent");
  };
  std::string out;
  int differing = 0;
  for (const std::string& key : keys) {
    const std::string here = value_in(a, key), there = value_in(b, key);
    if (here == there) continue;
    if (++differing <= 3) {
      out += (out.empty() ? "" : "; ") + dotted(key) + " is " + here + " on rank " +
             std::to_string(me) + " and " + there + " on rank " + std::to_string(other);
    }
  }
  if (differing > 3) out += " (and " + std::to_string(differing - 3) + " more)";
  return out;
}

namespace {

const std::string kTextKey = "config/0", kHashKey = "config/0/hash", kDiffersKey = "config/differs";

// What is left of `deadline`, at least a millisecond (a store's bound must be positive).
std::chrono::milliseconds time_left(std::chrono::steady_clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()));
}

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

// After every rank has compared its config (or said why it stopped): the line one rank
// published, if any, once every rank holds it; nullopt where all agree. Both barriers together
// take at most `timeout`.
//
// Rank 0 serves the store, and a node that could not start its ranks (its config unreadable,
// say) may have told that server why (Store::notices(), tell_tcp_store()): its ranks will not
// come. Rank 0 then publishes that line as a differing rank would, ends the check for the ranks
// that came, holds the store until they have read the line, and every one of them stops with it
// instead of waiting out `timeout` (Note [A node that could not start]).
std::optional<std::string> settle(comm::Store& store, int rank, int size,
                                  std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string checked = "config/checked", told = "config/told";
  std::function<bool()> told_of_a_node;
  if (rank == 0) told_of_a_node = [&store] { return !store.notices().empty(); };
  if (!comm::store_barrier(store, checked, rank, size, timeout, told_of_a_node)) {
    if (!store.check({kDiffersKey})) store.set(kDiffersKey, bytes_of(store.notices().front()));
    comm::store_barrier_release(store, checked);
    const std::int64_t came = comm::store_barrier_arrivals(store, checked);
    try {
      comm::store_barrier(store, told, rank, size, time_left(deadline), [&store, &told, came] {
        return comm::store_barrier_arrivals(store, told) >= came;
      });
    } catch (const CommError&) {
    }
    comm::store_barrier_release(store, told);
    const std::vector<std::uint8_t> line = store.get(kDiffersKey);
    return std::string(line.begin(), line.end());
  }
  if (!store.check({kDiffersKey})) return std::nullopt;
  const std::vector<std::uint8_t> line = store.get(kDiffersKey);
  // Rank 0's store serves until every rank has read the line: rank 0 unwinding at once would
  // take it away from the others mid-read. Past this barrier every rank holds the line, so
  // losing the store here (rank 0 gone first) changes nothing.
  try {
    comm::store_barrier(store, told, rank, size, time_left(deadline));
  } catch (const CommError&) {
  }
  return std::string(line.begin(), line.end());
}

}  // namespace

void agree_on_config(comm::Store& store, const std::string& agreement, int rank, int size,
                     std::chrono::milliseconds timeout) {
  // The hash alone goes to every rank: rank 0's store would otherwise send the text W times.
  const std::string hash = fnv1a_128_hex(agreement);
  if (rank == 0) {
    store.set(kTextKey, bytes_of(agreement));
    store.set(kHashKey, bytes_of(hash));
  } else if (const auto theirs = store.get(kHashKey); !theirs.empty() && theirs != bytes_of(hash)) {
    // (An empty hash: rank 0 stopped before it read its config, and said why.)
    const std::vector<std::uint8_t> text = store.get(kTextKey);
    // Texts that differ in no key (written in another order) agree.
    const std::string differences =
        config_differences(agreement, rank, {text.begin(), text.end()}, 0);
    if (!differences.empty()) {
      store.set(kDiffersKey, bytes_of("rank " + std::to_string(rank) +
                                      " runs another config than rank 0: " + differences +
                                      ": start every rank with the same config"));
    }
  }
  if (auto line = settle(store, rank, size, timeout)) throw UsageError(*line);
}

void tell_ranks_this_one_stopped(const RankPlace& place, const std::string& why,
                                 std::chrono::milliseconds timeout) {
  if (place.world_size <= 1 || place.rendezvous.empty()) return;
  const std::chrono::milliseconds bound = std::min(timeout, kTellBound);
  const auto deadline = std::chrono::steady_clock::now() + bound;
  try {
    // Where the others are slow to come (or never do), a note says what this rank waits for.
    const TimedStderrLine note(
        "partrain: rank " + std::to_string(place.rank) +
            " stopped; telling the other ranks why through " + place.rendezvous + " (at most " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(bound).count()) + " s)",
        kTellNoteAfter, std::chrono::seconds(0));
    comm::StoreOptions options;
    options.token = place.token;
    // A store that is not there soon may never be: a rendezvous this rank only guessed (its
    // config, which may name another, unread) must not hold it for the whole bound.
    options.timeout = std::min(time_left(deadline), kTellReachBound);
    options.rank = place.rank;
    options.world_size = place.world_size;
    options.host_server = place.rank == 0;
    const std::unique_ptr<comm::Store> store = comm::open_store(place.rendezvous, options);
    store->set_timeout(time_left(deadline));
    // The line first: the others read it once they see rank 0's empty hash, or pass the barrier.
    store->set(kDiffersKey,
               bytes_of("rank " + std::to_string(place.rank) + " (" + this_host_name() +
                        ") stopped before meeting the others: " + why));
    if (place.rank == 0) store->set(kHashKey, {});
    store->set_timeout(time_left(deadline));
    settle(*store, place.rank, place.world_size, time_left(deadline));
  } catch (...) {
    // Best effort, whatever failed: where the others cannot be told, they wait out their
    // timeout as before, and this rank reports its own error.
  }
}

}  // namespace partrain
