// defines: ImageDataset (an image classification split held in memory), load_dataset(),
// default_root(), and the byte limit every reader checks before it allocates.
//
// LibTorch-free: pixels stay uint8 here; the loader (trainer/data/loader.h) turns them into
// normalised float tensors batch by batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace partrain {
struct DataConfig;
}

namespace partrain::data {

// Readers refuse to hold more pixel bytes than this (a corrupt or hostile header must not
// make us allocate gigabytes). CIFAR-100's training split is 150 MiB.
inline constexpr std::uint64_t kMaxDatasetBytes = 4ull << 30;

struct ImageDataset {
  std::string name;       // "cifar100", "fashion-mnist", "synthetic"
  std::string split;      // "train" or "test"
  std::int64_t size = 0;  // number of samples
  int channels = 0;
  int height = 0;
  int width = 0;
  int num_classes = 0;
  // size * channels * height * width bytes; sample i is the planar CHW image at
  // i * sample_bytes(), rows top to bottom.
  std::vector<std::uint8_t> pixels;
  std::vector<std::int64_t> labels;  // size entries, each in [0, num_classes)
  // Per-channel mean and standard deviation of the training split in [0, 1] pixel units
  // (x / 255); the loader feeds (x / 255 - mean) / std to the model.
  std::vector<float> mean;
  std::vector<float> std;

  std::int64_t sample_bytes() const { return static_cast<std::int64_t>(channels) * height * width; }
  const std::uint8_t* image(std::int64_t i) const { return pixels.data() + i * sample_bytes(); }
};

// Loads the training (train = true) or test split named by cfg: dataset, root (empty: the
// default_root), download (fetch CIFAR-100 when its files are missing), url, train_limit /
// test_limit (keep only the first N samples; 0 = all) and, for "synthetic",
// synthetic_train / synthetic_test samples generated from `seed`.
// Missing files, corrupt files and bad settings throw UsageError with one line saying what
// and where (the path, and the byte offset for a bad value inside a file).
ImageDataset load_dataset(const DataConfig& cfg, bool train, std::uint64_t seed);

// Where a dataset is looked for when data.root is empty.
std::string default_root(const std::string& dataset);

// Keeps the first `limit` samples (limit <= 0 or >= size: unchanged).
void truncate_dataset(ImageDataset& dataset, std::int64_t limit);

// Mean and std per channel over all pixels of `dataset`, in [0, 1] units.
void compute_channel_stats(const ImageDataset& dataset, std::vector<float>& mean,
                           std::vector<float>& std);

}  // namespace partrain::data
