#include "trainer/config/config_agreement.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <vector>

#include "comm_backends/store/store.h"
#include "comm_backends/store/store_barrier.h"
#include "common/errors.h"
#include "common/hash.h"

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

void agree_on_config(comm::Store& store, const std::string& agreement, int rank, int size,
                     std::chrono::milliseconds timeout) {
  const auto bytes = [](const std::string& text) {
    return std::vector<std::uint8_t>(text.begin(), text.end());
  };
  const std::string text_key = "config/0", hash_key = "config/0/hash",
                    differs_key = "config/differs";
  // The hash alone goes to every rank: rank 0's store would otherwise send the text W times.
  const std::string hash = fnv1a_128_hex(agreement);
  if (rank == 0) {
    store.set(text_key, bytes(agreement));
    store.set(hash_key, bytes(hash));
  } else if (const auto theirs = store.get(hash_key); theirs != bytes(hash)) {
    const std::vector<std::uint8_t> text = store.get(text_key);
    // Texts that differ in no key (written in another order) agree.
    const std::string differences =
        config_differences(agreement, rank, {text.begin(), text.end()}, 0);
    if (!differences.empty()) {
      store.set(differs_key, bytes("rank " + std::to_string(rank) +
                                   " runs another config than rank 0: " + differences +
                                   ": start every rank with the same config"));
    }
  }
  comm::store_barrier(store, "config/checked", rank, size, timeout);
  if (store.check({differs_key})) {
    const std::vector<std::uint8_t> line = store.get(differs_key);
    // Rank 0's store serves until every rank has read the line: rank 0 unwinding at once would
    // take it away from the others mid-read. Past this barrier every rank holds the line, so
    // losing the store here (rank 0 gone first) changes nothing.
    try {
      comm::store_barrier(store, "config/told", rank, size, timeout);
    } catch (const CommError&) {
    }
    throw UsageError(std::string(line.begin(), line.end()));
  }
}

}  // namespace partrain
