// defines: ImageDataset (an image classification split held in memory), load_dataset(),
// load_splits(), TensorFileReader, default_root(), and the byte limit every reader checks
// before it allocates.
//
// LibTorch-free: pixels stay uint8 here; the loader (trainer/data/loader.h) turns them into
// normalised float tensors batch by batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config_enums.h"

namespace partrain {
struct DataConfig;
}

namespace partrain::data {

// Readers refuse to hold more pixel bytes than this (a corrupt or hostile header must not
// make us allocate gigabytes). CIFAR-100's training split is 150 MiB.
inline constexpr std::uint64_t kMaxDatasetBytes = 4ull << 30;

struct ImageDataset {
  std::string name;       // the data.dataset name: "cifar100", "image-folder", ...
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

// The reader of torch.save'd tensor files (read_tensor_file in trainer/data/tensor_file.h).
// It needs LibTorch, which this library must not link, so callers that have it pass it in.
using TensorFileReader = ImageDataset (*)(const std::string& path, std::int64_t limit);

// Loads the training (train = true) or test split named by cfg: dataset, root (empty: the
// default_root), download (fetch CIFAR-100 when its files are missing), url, train_limit /
// test_limit (keep only the first N samples; 0 = all), image_size (image-folder), mean / std
// (1 value or one per channel; empty: the dataset's own) and, for "synthetic",
// synthetic_train / synthetic_test samples generated from `seed`.
//
// Where the files are, per dataset (ROOT = data.root):
//   cifar100       ROOT/train.bin, ROOT/test.bin
//   cifar10        ROOT/data_batch_1.bin .. data_batch_5.bin, ROOT/test_batch.bin
//   fashion-mnist  ROOT/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
//   mnist          the same names as fashion-mnist
//   image-folder   ROOT/train/<class>/<images>, ROOT/val/<class>/<images> (or ROOT/test/)
//   tensors        ROOT/train.pt, ROOT/test.pt
// The datasets with published statistics (cifar100, cifar10, fashion-mnist, mnist) carry
// them; image-folder and tensors compute the per-channel mean and std of their training split
// (test splits are normalised with those too).
//
// Missing files, corrupt files and bad settings throw UsageError with one line saying what
// and where (the path, and the byte offset for a bad value inside a file). "tensors" needs
// `tensor_reader`; without it, it is a UsageError.
ImageDataset load_dataset(const DataConfig& cfg, bool train, std::uint64_t seed,
                          TensorFileReader tensor_reader = nullptr);

struct DatasetSplits {
  ImageDataset train;
  ImageDataset test;
};

// Both splits, as load_dataset would give them, but reading the training split once where
// the test split's statistics come from it.
DatasetSplits load_splits(const DataConfig& cfg, std::uint64_t seed,
                          TensorFileReader tensor_reader = nullptr);

// Where a dataset is looked for when data.root is empty.
std::string default_root(DatasetKind dataset);

// Keeps the first `limit` samples (limit <= 0 or >= size: unchanged).
void truncate_dataset(ImageDataset& dataset, std::int64_t limit);

// Mean and std per channel over all pixels of `dataset`, in [0, 1] units.
void compute_channel_stats(const ImageDataset& dataset, std::vector<float>& mean,
                           std::vector<float>& std);

}  // namespace partrain::data
