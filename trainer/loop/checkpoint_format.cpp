#include "trainer/loop/checkpoint_format.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace partrain {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

}  // namespace

std::string manifest_to_text(const CheckpointManifest& manifest) {
  const Json json = {{"format", kCheckpointFormat},
                     {"file", manifest.file},
                     {"epoch", manifest.epoch},
                     {"step", manifest.step},
                     {"bytes", manifest.bytes}};
  return json.dump(2) + "\n";
}

CheckpointManifest manifest_from_text(const std::string& text, const std::string& path) {
  CheckpointManifest manifest;
  try {
    const Json json = Json::parse(text);
    manifest.file = json.at("file").get<std::string>();
    manifest.epoch = json.at("epoch").get<int>();
    manifest.step = json.at("step").get<std::int64_t>();
    manifest.bytes = json.at("bytes").get<std::uint64_t>();
  } catch (const Json::exception& e) {
    throw UsageError("checkpoint manifest " + path + " is not valid: " + e.what());
  }
  return manifest;
}

std::string manifest_path(const std::string& dir) { return dir + "/latest.json"; }

std::string checkpoint_file_name(int epochs_completed) {
  char name[32];
  std::snprintf(name, sizeof(name), "epoch-%04d.pt", epochs_completed);
  return name;
}

std::string checkpoint_file_name(int epochs_completed, std::int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "epoch-%04d.step-%010lld.pt", epochs_completed,
                static_cast<long long>(step));
  return name;
}

bool is_checkpoint_file_name(const std::string& file) {
  return file.rfind("epoch-", 0) == 0 && file.size() > 3 &&
         file.compare(file.size() - 3, 3, ".pt") == 0 && file.find(".tmp") == std::string::npos;
}

std::string shard_file_name(const std::string& file, int rank, int world) {
  char suffix[48];
  std::snprintf(suffix, sizeof(suffix), ".shard-%05d-of-%05d", rank, world);
  return file + suffix;
}

std::optional<ShardName> parse_shard_file_name(const std::string& name) {
  const auto at = name.rfind(".shard-");
  if (at == std::string::npos || name.find(".tmp") != std::string::npos) return std::nullopt;
  ShardName shard;
  shard.file = name.substr(0, at);
  int consumed = 0;
  if (std::sscanf(name.c_str() + at, ".shard-%5d-of-%5d%n", &shard.rank, &shard.world, &consumed) !=
          2 ||
      static_cast<std::size_t>(consumed) != name.size() - at || shard.world < 1 || shard.rank < 0 ||
      shard.rank >= shard.world || shard.file.empty()) {
    return std::nullopt;
  }
  return shard;
}

void write_manifest(const std::string& dir, const CheckpointManifest& manifest) {
  write_file_atomically(manifest_path(dir), manifest_to_text(manifest));
}

std::optional<CheckpointManifest> read_manifest(const std::string& dir) {
  const std::string path = manifest_path(dir);
  if (!fs::exists(path)) return std::nullopt;
  return manifest_from_text(read_checkpoint_file(path), path);
}

std::string meta_to_text(const CheckpointMeta& meta) {
  Json epochs = Json::array();
  for (const auto& e : meta.epochs) epochs.push_back(Json(epoch_to_json(e)));
  Json json = {{"format", kCheckpointFormat},
               {"epoch", meta.epoch},
               {"step", meta.step},
               {"world_size", meta.world_size},
               {"model", meta.model},
               {"width", meta.width},
               {"norm", meta.norm},
               {"seed", meta.seed},
               {"optimizer", meta.optimizer},
               {"test_accuracy", meta.test_accuracy},
               {"epochs", epochs}};
  if (meta.loss_scaler) {
    json["loss_scale"] = meta.loss_scaler->scale;
    json["loss_scale_good_steps"] = meta.loss_scaler->good_steps;
  }
  // Only in global-batch mode: a per-rank run's checkpoint stays as earlier versions wrote it.
  if (meta.global_batch_size > 0) {
    json["global_batch_size"] = meta.global_batch_size;
    json["accumulate_steps"] = meta.accumulate_steps;
    json["shares_rule"] = meta.shares_rule;
    json["shares"] = meta.shares;
  }
  // Only mid-epoch: a checkpoint at an epoch's end stays as earlier versions wrote it.
  if (meta.mid_epoch.any()) {
    json["micro_step_in_epoch"] = meta.mid_epoch.micro_step;
    json["partial_loss_sums"] = meta.mid_epoch.loss_sums;
    json["partial_images"] = meta.mid_epoch.images;
    json["partial_train_seconds"] = meta.mid_epoch.train_seconds;
    json["skipped_steps"] = meta.mid_epoch.skipped_steps;
  }
  return json.dump();
}

namespace {

CheckpointMeta meta_from_json(const Json& json) {
  CheckpointMeta meta;
  meta.epoch = json.at("epoch").get<int>();
  meta.step = json.at("step").get<std::int64_t>();
  meta.world_size = json.at("world_size").get<int>();
  meta.model = json.at("model").get<std::string>();
  meta.width = json.at("width").get<int>();
  meta.norm = json.at("norm").get<std::string>();
  meta.seed = json.at("seed").get<std::uint64_t>();
  meta.optimizer = json.value("optimizer", std::string());
  meta.test_accuracy = json.value("test_accuracy", 0.0);
  for (const auto& e : json.at("epochs")) meta.epochs.push_back(epoch_from_json(e));
  if (json.contains("loss_scale")) {
    LossScalerState scaler;
    scaler.scale = json.at("loss_scale").get<double>();
    scaler.good_steps = json.at("loss_scale_good_steps").get<std::int64_t>();
    meta.loss_scaler = scaler;
  }
  if (json.contains("global_batch_size")) {
    meta.global_batch_size = json.at("global_batch_size").get<std::int64_t>();
    meta.accumulate_steps = json.at("accumulate_steps").get<int>();
    meta.shares_rule = json.at("shares_rule").get<std::string>();
    meta.shares = json.at("shares").get<std::vector<std::int64_t>>();
  }
  if (json.contains("micro_step_in_epoch")) {
    meta.mid_epoch.micro_step = json.at("micro_step_in_epoch").get<std::int64_t>();
    meta.mid_epoch.loss_sums = json.at("partial_loss_sums").get<std::vector<double>>();
    meta.mid_epoch.images = json.at("partial_images").get<std::vector<double>>();
    meta.mid_epoch.train_seconds = json.at("partial_train_seconds").get<double>();
    meta.mid_epoch.skipped_steps = json.at("skipped_steps").get<std::int64_t>();
  }
  return meta;
}

}  // namespace

CheckpointMeta meta_from_text(const std::string& text, const std::string& path) {
  try {
    return meta_from_json(Json::parse(text));
  } catch (const Json::exception& e) {
    throw UsageError("checkpoint " + path + ": its meta is not valid: " + e.what());
  }
}

std::string read_checkpoint_file(const std::string& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, "checkpoint ", path, ": cannot read (", ec.message(), ")");
  PARTRAIN_CHECK(size <= kMaxCheckpointBytes, UsageError, "checkpoint ", path, ": ", size,
                 " bytes is larger than any checkpoint partrain writes");
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  PARTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(size), UsageError, "checkpoint ", path,
                 ": short read");
  return bytes;
}

}  // namespace partrain
