// defines: kCheckpointFormat, CheckpointManifest (latest.json) and CheckpointMeta (a
// checkpoint's "meta" entry), each with the one writer and the one reader of its JSON text;
// write_manifest(), read_manifest() and read_checkpoint_file(). LibTorch-free: the tensors of
// a checkpoint are checkpoint.cpp's, which also describes the folder's layout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/precision/loss_scale.h"
#include "trainer/report/report_writer.h"

namespace partrain {

// The "format" of a checkpoint's dict, of its meta and of the manifest.
inline constexpr const char* kCheckpointFormat = "partrain.checkpoint/1";
// No checkpoint partrain writes is larger; a bigger file or announced size is refused.
inline constexpr std::uint64_t kMaxCheckpointBytes = 16ull << 30;

// latest.json: names the newest checkpoint that was written whole.
struct CheckpointManifest {
  std::string file;  // the checkpoint's name in the manifest's folder: "epoch-0003.pt"
  int epoch = 0;
  std::int64_t step = 0;
  std::uint64_t bytes = 0;  // the checkpoint's size
};

std::string manifest_to_text(const CheckpointManifest& manifest);
// Throws UsageError naming `path` (where the text came from) and what is missing or wrong.
CheckpointManifest manifest_from_text(const std::string& text, const std::string& path);

std::string manifest_path(const std::string& dir);  // DIR/latest.json
// "epoch-0003.pt": the checkpoint at the end of epoch 3. "epoch-0003.step-0000001234.pt": the
// one at step 1234, taken mid-epoch after 3 epochs completed. The names sort in the order they
// were taken, which is how checkpoint.keep finds the oldest.
std::string checkpoint_file_name(int epochs_completed);
std::string checkpoint_file_name(int epochs_completed, std::int64_t step);
// Whether `file` is such a name (temp files, shard files and best.pt are not).
bool is_checkpoint_file_name(const std::string& file);
// The shard of `rank` of `world` ranks beside checkpoint `file` (a sharded run's: each rank
// writes its own): "epoch-0003.pt.shard-00001-of-00004", "best.pt.shard-00000-of-00002".
std::string shard_file_name(const std::string& file, int rank, int world);
// For such a name: the checkpoint's name and the shard's rank; nothing for any other name.
struct ShardName {
  std::string file;
  int rank = 0;
  int world = 0;
};
std::optional<ShardName> parse_shard_file_name(const std::string& name);
// Atomically (common/atomic_file.h), so that a crash leaves the previous manifest whole.
void write_manifest(const std::string& dir, const CheckpointManifest& manifest);
// Empty when DIR has no manifest; throws UsageError when it has one that is not readable.
std::optional<CheckpointManifest> read_manifest(const std::string& dir);

// Where a checkpoint taken mid-epoch stands in its epoch: what the epoch's record will need
// when the epoch is finished by a resumed run.
struct MidEpoch {
  // The epoch's batches trained: micro-steps, the same count on every rank (in global-batch
  // mode each is M samples over all ranks, whatever the world size).
  std::int64_t micro_step = 0;
  // Per rank, in rank order: its training loss summed over its images so far, and the images.
  std::vector<double> loss_sums;
  std::vector<double> images;
  double train_seconds = 0;        // the epoch's training time so far (rank 0's clock)
  std::int64_t skipped_steps = 0;  // f16 updates skipped so far in the run
  bool any() const { return micro_step > 0; }
};

// A checkpoint's "meta" entry, JSON text beside its tensors: where training stood, and the
// run that wrote it.
struct CheckpointMeta {
  int epoch = 0;          // epochs completed
  std::int64_t step = 0;  // optimizer steps taken
  int world_size = 0;
  std::string model;
  int width = 0;
  std::string norm;
  std::uint64_t seed = 0;
  std::string optimizer;     // "" in checkpoints of earlier versions
  double test_accuracy = 0;  // of the last epoch; 0 in checkpoints of earlier versions
  std::vector<EpochRecord> epochs;
  std::optional<LossScalerState> loss_scaler;  // precision f16 only
  // Global-batch mode (data.global_batch_size): samples per step over all ranks, the micro-steps
  // a step accumulates, and how each micro-step was split over the ranks (shares_rule: the
  // data.balance it came from, "even" (M / W each), "weights" or "auto"; shares: the samples of
  // each rank at the checkpoint's step, in rank order). 0 or empty in per-rank mode
  // and in checkpoints of earlier versions. With them, mid_epoch.micro_step counts micro-steps
  // of M samples over all ranks, the same position for any world size.
  std::int64_t global_batch_size = 0;
  int accumulate_steps = 0;
  std::string shares_rule;
  std::vector<std::int64_t> shares;
  // Within epoch `epoch + 1`, for a checkpoint taken mid-epoch (all 0 or empty at an epoch's
  // end, and in checkpoints of earlier versions, which were all taken at an epoch's end).
  MidEpoch mid_epoch;
};

std::string meta_to_text(const CheckpointMeta& meta);
// A UsageError naming `path` where `text` is not such a meta.
CheckpointMeta meta_from_text(const std::string& text, const std::string& path);

// The whole file; throws UsageError naming `path` when it cannot be read or is larger than any
// checkpoint partrain writes.
std::string read_checkpoint_file(const std::string& path);

}  // namespace partrain
