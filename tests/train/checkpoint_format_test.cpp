// The checkpoint folder's small records, written and read back through the one writer and the
// one reader partrain has for each: the manifest (latest.json) and a checkpoint's meta.
#include "trainer/loop/checkpoint_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/temp_dir.h"

namespace partrain {
namespace {

using Json = nlohmann::json;

std::string message_of(const std::string& text, const std::string& path) {
  try {
    manifest_from_text(text, path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(CheckpointManifest, WrittenIntoItsFolderAndReadBack) {
  TempDir dir("partrain-manifest");
  EXPECT_FALSE(read_manifest(dir.string()).has_value());  // no manifest: start afresh

  write_manifest(dir.string(), {"epoch-0007.pt", 7, 1234, 5678901234ull});
  EXPECT_EQ(manifest_path(dir.string()), dir.string() + "/latest.json");
  const auto read = read_manifest(dir.string());
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->file, "epoch-0007.pt");
  EXPECT_EQ(read->epoch, 7);
  EXPECT_EQ(read->step, 1234);
  EXPECT_EQ(read->bytes, 5678901234ull);

  // A later save replaces it whole.
  write_manifest(dir.string(), {"epoch-0008.pt", 8, 1400, 99});
  EXPECT_EQ(read_manifest(dir.string())->file, "epoch-0008.pt");
  EXPECT_EQ(read_manifest(dir.string())->step, 1400);
}

TEST(CheckpointManifest, TheFileHoldsTheFormatAndTheFieldsInJson) {
  const Json json = Json::parse(manifest_to_text({"epoch-0003.pt", 3, 42, 1000}));
  EXPECT_EQ(json.at("format"), kCheckpointFormat);
  EXPECT_EQ(json.at("file"), "epoch-0003.pt");
  EXPECT_EQ(json.at("epoch"), 3);
  EXPECT_EQ(json.at("step"), 42);
  EXPECT_EQ(json.at("bytes"), 1000);
  EXPECT_EQ(json.size(), 5u);
}

TEST(CheckpointManifest, TextThatIsNoManifestIsRefusedNamingTheFile) {
  const std::string path = "/runs/out/checkpoints/latest.json";
  const std::string garbled = message_of("{\"file\": \"epoch-0001.pt\", \"ep", path);
  EXPECT_NE(garbled.find("checkpoint manifest " + path + " is not valid"), std::string::npos)
      << garbled;
  const std::string no_file = message_of(R"({"epoch": 1, "step": 2, "bytes": 3})", path);
  EXPECT_NE(no_file.find(path), std::string::npos) << no_file;
  EXPECT_NE(no_file.find("'file'"), std::string::npos) << no_file;
  const std::string wrong_type =
      message_of(R"({"file": 7, "epoch": 1, "step": 2, "bytes": 3})", path);
  EXPECT_NE(wrong_type.find("is not valid"), std::string::npos) << wrong_type;
}

TEST(CheckpointManifest, AnUnreadableManifestIsAUsageError) {
  TempDir dir("partrain-manifest");
  std::ofstream(dir.path() / "latest.json") << "[1, 2";
  EXPECT_THROW(read_manifest(dir.string()), UsageError);
}

EpochRecord record(int epoch, double scale) {
  EpochRecord e;
  e.epoch = epoch;
  e.seconds = 1.5 * scale;
  e.train_seconds = 1.25 * scale;
  e.train_images_per_s = 4000.5 * scale;
  e.images = 60000;
  e.steps = 469 * epoch;
  e.train_loss = 0.3125 / scale;
  e.test_loss = 0.28125 / scale;
  e.test_accuracy = 0.9 + 0.01 * epoch;
  e.test_accuracy_top5 = 0.995;
  e.skipped_steps = epoch;
  return e;
}

void expect_same_record(const EpochRecord& a, const EpochRecord& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.seconds, b.seconds);
  EXPECT_EQ(a.train_seconds, b.train_seconds);
  EXPECT_EQ(a.train_images_per_s, b.train_images_per_s);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.train_loss, b.train_loss);
  EXPECT_EQ(a.test_loss, b.test_loss);
  EXPECT_EQ(a.test_accuracy, b.test_accuracy);
  EXPECT_EQ(a.test_accuracy_top5, b.test_accuracy_top5);
  EXPECT_EQ(a.skipped_steps, b.skipped_steps);
}

CheckpointMeta full_meta() {
  CheckpointMeta meta;
  meta.epoch = 2;
  meta.step = 938;
  meta.world_size = 4;
  meta.model = "resnet18";
  meta.width = 32;
  meta.norm = "none";
  meta.seed = 18446744073709551557ull;  // beyond int64: the seed is unsigned
  meta.optimizer = "adamw";
  meta.test_accuracy = 0.92;
  meta.epochs = {record(1, 1.0), record(2, 3.0)};
  meta.loss_scaler = LossScalerState{8192.0, 1500};
  return meta;
}

TEST(CheckpointMeta, EveryFieldReadsBackAsWritten) {
  const CheckpointMeta in = full_meta();
  const CheckpointMeta out = meta_from_text(meta_to_text(in), "c.pt");
  EXPECT_EQ(out.epoch, 2);
  EXPECT_EQ(out.step, 938);
  EXPECT_EQ(out.world_size, 4);
  EXPECT_EQ(out.model, "resnet18");
  EXPECT_EQ(out.width, 32);
  EXPECT_EQ(out.norm, "none");
  EXPECT_EQ(out.seed, 18446744073709551557ull);
  EXPECT_EQ(out.optimizer, "adamw");
  EXPECT_EQ(out.test_accuracy, 0.92);
  ASSERT_EQ(out.epochs.size(), 2u);
  expect_same_record(out.epochs[0], in.epochs[0]);
  expect_same_record(out.epochs[1], in.epochs[1]);
  ASSERT_TRUE(out.loss_scaler.has_value());
  EXPECT_EQ(out.loss_scaler->scale, 8192.0);
  EXPECT_EQ(out.loss_scaler->good_steps, 1500);
  EXPECT_EQ(Json::parse(meta_to_text(in)).at("format"), kCheckpointFormat);
}

TEST(CheckpointMeta, WithoutALossScalerNoneComesBack) {
  CheckpointMeta in = full_meta();
  in.loss_scaler.reset();
  const std::string text = meta_to_text(in);
  EXPECT_FALSE(Json::parse(text).contains("loss_scale"));
  EXPECT_FALSE(meta_from_text(text, "c.pt").loss_scaler.has_value());
}

TEST(CheckpointMeta, TheMetaOfTheFirstVersionStillReads) {
  // Written before the optimizer, the best accuracy, the loss scale and the epoch records'
  // top-5 and skipped steps were recorded.
  const std::string first_version = R"({"format": "partrain.checkpoint/1", "epoch": 1,
      "step": 469, "world_size": 2, "model": "lenet", "width": 64, "norm": "batch", "seed": 7,
      "epochs": [{"epoch": 1, "seconds": 3.5, "train_seconds": 3.0, "train_images_per_s": 20000.0,
                  "images": 60000, "steps": 469, "train_loss": 0.25, "test_loss": 0.125,
                  "test_accuracy": 0.96}]})";
  const CheckpointMeta meta = meta_from_text(first_version, "c.pt");
  EXPECT_EQ(meta.epoch, 1);
  EXPECT_EQ(meta.step, 469);
  EXPECT_EQ(meta.world_size, 2);
  EXPECT_EQ(meta.model, "lenet");
  EXPECT_EQ(meta.optimizer, "");
  EXPECT_EQ(meta.test_accuracy, 0.0);
  EXPECT_FALSE(meta.loss_scaler.has_value());
  ASSERT_EQ(meta.epochs.size(), 1u);
  EXPECT_EQ(meta.epochs[0].test_accuracy, 0.96);
  EXPECT_EQ(meta.epochs[0].skipped_steps, 0);
}

// A meta that is not JSON, lacks a field or holds one of another type is a usage error naming
// the checkpoint, not nlohmann's exception (which would end a resume as an internal error).
TEST(CheckpointMeta, AMissingFieldIsAnError) {
  Json json = Json::parse(meta_to_text(full_meta()));
  json.erase("world_size");
  Json typed = Json::parse(meta_to_text(full_meta()));
  typed["optimizer"] = 3;
  for (const std::string& text : {json.dump(), std::string("not json"), typed.dump()}) {
    try {
      meta_from_text(text, "c.pt");
      FAIL() << text;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("checkpoint c.pt: its meta is not valid: ", 0), 0u)
          << e.what();
    }
  }
}

TEST(CheckpointMeta, TheMidEpochPositionReadsBackAsWritten) {
  CheckpointMeta in = full_meta();
  in.mid_epoch.micro_step = 17;
  in.mid_epoch.loss_sums = {12.5, 0.1 + 0.2, 1e300};  // f64 values come back exactly
  in.mid_epoch.images = {544, 544, 512};
  in.mid_epoch.train_seconds = 3.25;
  in.mid_epoch.skipped_steps = 4;
  const std::string text = meta_to_text(in);
  EXPECT_EQ(Json::parse(text).at("micro_step_in_epoch"), 17);
  const CheckpointMeta out = meta_from_text(text, "c.pt");
  EXPECT_EQ(out.mid_epoch.micro_step, 17);
  EXPECT_EQ(out.mid_epoch.loss_sums, in.mid_epoch.loss_sums);
  EXPECT_EQ(out.mid_epoch.images, in.mid_epoch.images);
  EXPECT_EQ(out.mid_epoch.train_seconds, 3.25);
  EXPECT_EQ(out.mid_epoch.skipped_steps, 4);
  EXPECT_EQ(out.step, 938);
}

TEST(CheckpointMeta, TheGlobalBatchReadsBackAsWritten) {
  CheckpointMeta in = full_meta();
  in.global_batch_size = 96;
  in.accumulate_steps = 2;
  in.shares_rule = "even";
  in.shares = {12, 12, 12, 12};
  const std::string text = meta_to_text(in);
  EXPECT_EQ(Json::parse(text).at("global_batch_size"), 96);
  const CheckpointMeta out = meta_from_text(text, "c.pt");
  EXPECT_EQ(out.global_batch_size, 96);
  EXPECT_EQ(out.accumulate_steps, 2);
  EXPECT_EQ(out.shares_rule, "even");
  EXPECT_EQ(out.shares, (std::vector<std::int64_t>{12, 12, 12, 12}));
  // Per-rank mode writes none of it, as earlier versions did, and reads back as per-rank.
  const std::string per_rank = meta_to_text(full_meta());
  EXPECT_FALSE(Json::parse(per_rank).contains("global_batch_size"));
  EXPECT_FALSE(Json::parse(per_rank).contains("shares"));
  EXPECT_EQ(meta_from_text(per_rank, "c.pt").global_batch_size, 0);
  EXPECT_TRUE(meta_from_text(per_rank, "c.pt").shares.empty());
}

TEST(CheckpointMeta, AtAnEpochsEndNoMidEpochKeysAreWritten) {
  const std::string text = meta_to_text(full_meta());
  EXPECT_FALSE(Json::parse(text).contains("micro_step_in_epoch"));
  EXPECT_FALSE(meta_from_text(text, "c.pt").mid_epoch.any());
}

TEST(CheckpointNames, SortInTheOrderTheyWereTaken) {
  EXPECT_EQ(checkpoint_file_name(3), "epoch-0003.pt");
  EXPECT_EQ(checkpoint_file_name(3, 1234), "epoch-0003.step-0000001234.pt");
  std::vector<std::string> taken = {checkpoint_file_name(1),          checkpoint_file_name(1, 40),
                                    checkpoint_file_name(1, 75),      checkpoint_file_name(2),
                                    checkpoint_file_name(2, 9999999), checkpoint_file_name(10)};
  std::vector<std::string> sorted = taken;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, taken);
  for (const auto& name : taken) EXPECT_TRUE(is_checkpoint_file_name(name)) << name;
  EXPECT_FALSE(is_checkpoint_file_name("best.pt"));
  EXPECT_FALSE(is_checkpoint_file_name("latest.json"));
  EXPECT_FALSE(is_checkpoint_file_name("epoch-0003.pt.tmp.12"));
}

// A shard file names its checkpoint, its rank and the world, reads back as them, sorts with its
// checkpoint, and is not taken for a checkpoint itself.
TEST(CheckpointNames, ShardFilesNameTheirCheckpointRankAndWorld) {
  const std::string name = shard_file_name(checkpoint_file_name(3), 1, 4);
  EXPECT_EQ(name, "epoch-0003.pt.shard-00001-of-00004");
  EXPECT_FALSE(is_checkpoint_file_name(name));
  const auto parsed = parse_shard_file_name(name);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->file, "epoch-0003.pt");
  EXPECT_EQ(parsed->rank, 1);
  EXPECT_EQ(parsed->world, 4);
  EXPECT_EQ(parse_shard_file_name("best.pt.shard-00000-of-00002")->file, "best.pt");
  EXPECT_FALSE(parse_shard_file_name("epoch-0003.pt").has_value());
  EXPECT_FALSE(parse_shard_file_name("epoch-0003.pt.shard-00004-of-00004").has_value());
  EXPECT_FALSE(parse_shard_file_name("epoch-0003.pt.shard-00001-of-00004.tmp-7-1").has_value());
  EXPECT_FALSE(parse_shard_file_name("epoch-0003.pt.shard-00001-of-00004x").has_value());
}

}  // namespace
}  // namespace partrain
