#include "trainer/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <tuple>
#include <vector>

#include "common/errors.h"
#include "trainer/config/config.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/download.h"
#include "trainer/data/idx_reader.h"
#include "trainer/data/image_folder.h"
#include "trainer/data/synthetic.h"

namespace partrain::data {

namespace fs = std::filesystem;

namespace {

constexpr int kFashionMnistClasses = 10;
constexpr int kMnistClasses = 10;
// MNIST's published statistics of its 60000 training digits, in [0, 1] units.
constexpr float kMnistMean = 0.1307f;
constexpr float kMnistStd = 0.3081f;

ImageDataset load_cifar100(const DataConfig& cfg, bool train, std::int64_t limit) {
  const std::string root = cfg.root.empty() ? default_root(DatasetKind::kCifar100) : cfg.root;
  const fs::path file = fs::path(root) / (train ? "train.bin" : "test.bin");
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    if (!cfg.download) {
      const fs::path parent = fs::path(root).parent_path();
      const std::string fetch_hint =
          fs::path(root).filename() == "cifar-100-binary"
              ? detail::concat("`partrain data fetch cifar100 --dir ",
                               parent.empty() ? "." : parent.string(), "`")
              : "`partrain data fetch cifar100 --dir DIR` (then data.root: "
                "DIR/cifar-100-binary)";
      throw UsageError(detail::concat("cifar100: ", file.string(), " not found; get it with ",
                                      fetch_hint, ", or set data.download: true"));
    }
    FetchOptions fetch;
    fetch.url = cfg.url;
    fetch_cifar100(root, fetch);
  }
  return read_cifar100_bin(file.string(), limit);
}

// IDX files may be plain or gzipped; the plain one wins when both exist.
std::string find_idx_file(DatasetKind dataset, const std::string& root, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem, stem + ".gz"}) {
    const fs::path candidate = fs::path(root) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  const std::string hint =
      dataset == DatasetKind::kFashionMnist
          ? detail::concat("install it with `apt-get install dataset-fashion-mnist` (files in ",
                           default_root(DatasetKind::kFashionMnist), ")")
          : std::string("download the four IDX files of the MNIST release");
  throw UsageError(detail::concat(name_of(dataset), ": ", (fs::path(root) / stem).string(),
                                  "[.gz] not found; ", hint,
                                  " or point data.root at a folder holding the IDX files"));
}

ImageDataset load_mnist_like(const DataConfig& cfg, bool train, std::int64_t limit) {
  const std::string root = cfg.root.empty() ? default_root(cfg.dataset) : cfg.root;
  const std::string prefix = train ? "train" : "t10k";
  const std::string images = find_idx_file(cfg.dataset, root, prefix + "-images-idx3-ubyte");
  const std::string labels = find_idx_file(cfg.dataset, root, prefix + "-labels-idx1-ubyte");
  if (cfg.dataset == DatasetKind::kFashionMnist) {
    return read_idx_dataset(images, labels, kFashionMnistClasses, limit);
  }
  // MNIST and Fashion-MNIST share the file format; only the name and statistics differ.
  ImageDataset out = read_idx_dataset(images, labels, kMnistClasses, limit);
  out.name = "mnist";
  out.mean = {kMnistMean};
  out.std = {kMnistStd};
  return out;
}

ImageDataset load_cifar10(const DataConfig& cfg, bool train, std::int64_t limit) {
  const std::string root = cfg.root.empty() ? default_root(DatasetKind::kCifar10) : cfg.root;
  std::vector<std::string> files;
  if (train) {
    for (int b = 1; b <= 5; ++b) {
      files.push_back((fs::path(root) / ("data_batch_" + std::to_string(b) + ".bin")).string());
    }
  } else {
    files.push_back((fs::path(root) / "test_batch.bin").string());
  }
  std::error_code ec;
  for (const std::string& file : files) {
    PARTRAIN_CHECK(fs::exists(file, ec), UsageError, "cifar10: ", file,
                   " not found; download the binary release "
                   "(https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz), unpack it and "
                   "point data.root at its cifar-10-batches-bin folder");
  }
  return read_cifar10_bin(files, limit);
}

ImageDataset load_image_folder(const DataConfig& cfg, bool train, std::int64_t limit) {
  PARTRAIN_CHECK(!cfg.root.empty(), UsageError,
                 "image-folder: set data.root to a folder holding train/<class>/<images> and "
                 "val/<class>/<images>");
  const fs::path train_dir = fs::path(cfg.root) / "train";
  ImageFolderOptions options;
  options.image_size = cfg.image_size;
  options.threads = cfg.num_workers;
  options.limit = limit;
  if (train) return read_image_folder(train_dir.string(), options);
  // The labels of the validation split are the training split's class indices.
  options.classes = list_image_classes(train_dir.string());
  std::error_code ec;
  fs::path test_dir = fs::path(cfg.root) / "val";
  if (!fs::is_directory(test_dir, ec) && fs::is_directory(fs::path(cfg.root) / "test", ec)) {
    test_dir = fs::path(cfg.root) / "test";
  }
  PARTRAIN_CHECK(fs::is_directory(test_dir, ec), UsageError, "image-folder: ", test_dir.string(),
                 " not found; the validation split goes in val/<class>/ (or "
                 "test/<class>/) beside train/");
  return read_image_folder(test_dir.string(), options);
}

ImageDataset load_tensors(const DataConfig& cfg, bool train, std::int64_t limit,
                          TensorFileReader tensor_reader) {
  PARTRAIN_CHECK(tensor_reader != nullptr, UsageError,
                 "data.dataset tensors needs LibTorch's reader, which this program lacks");
  PARTRAIN_CHECK(!cfg.root.empty(), UsageError,
                 "tensors: set data.root to a folder holding train.pt and test.pt");
  return tensor_reader((fs::path(cfg.root) / (train ? "train.pt" : "test.pt")).string(), limit);
}

// Whether the dataset's statistics come from its training split rather than a table.
bool computes_own_stats(DatasetKind dataset) {
  return dataset == DatasetKind::kImageFolder || dataset == DatasetKind::kTensors;
}

ImageDataset read_synthetic(const DataConfig& cfg, bool train, std::uint64_t seed,
                            std::int64_t limit) {
  SyntheticOptions options;
  options.size = train ? cfg.synthetic_train : cfg.synthetic_test;
  if (limit > 0) options.size = std::min(options.size, limit);
  options.train = train;
  options.seed = seed;
  ImageDataset out = generate_synthetic(options);
  if (!train) {
    // Normalise the test split with the training split's statistics, as for real data.
    options.size = cfg.synthetic_train;
    options.train = true;
    const ImageDataset train_split = generate_synthetic(options);
    out.mean = train_split.mean;
    out.std = train_split.std;
  }
  return out;
}

// The split as the dataset's reader gives it.
ImageDataset read_dataset(const DataConfig& cfg, bool train, std::uint64_t seed, std::int64_t limit,
                          TensorFileReader tensor_reader) {
  switch (cfg.dataset) {
    case DatasetKind::kCifar100:
      return load_cifar100(cfg, train, limit);
    case DatasetKind::kCifar10:
      return load_cifar10(cfg, train, limit);
    case DatasetKind::kFashionMnist:
    case DatasetKind::kMnist:
      return load_mnist_like(cfg, train, limit);
    case DatasetKind::kImageFolder:
      return load_image_folder(cfg, train, limit);
    case DatasetKind::kTensors:
      return load_tensors(cfg, train, limit, tensor_reader);
    case DatasetKind::kSynthetic:
      return read_synthetic(cfg, train, seed, limit);
  }
  throw Error(
      detail::concat("data.dataset: no reader for enumerator ", static_cast<int>(cfg.dataset)));
}

// One split as its reader gives it: for image-folder and tensors without mean and std.
ImageDataset read_split(const DataConfig& cfg, bool train, std::uint64_t seed,
                        TensorFileReader tensor_reader) {
  const std::int64_t limit = train ? cfg.train_limit : cfg.test_limit;
  PARTRAIN_CHECK(limit >= 0, UsageError, "data.", train ? "train_limit" : "test_limit",
                 " must be >= 0, not ", limit);
  ImageDataset out = read_dataset(cfg, train, seed, limit, tensor_reader);
  out.split = train ? "train" : "test";
  return out;
}

// The test split must fit the model the training split shapes: same image shape, labels
// among the training split's classes.
void check_test_split(const DataConfig& cfg, const ImageDataset& train, ImageDataset& test) {
  const std::string where = cfg.dataset == DatasetKind::kTensors
                                ? (fs::path(cfg.root) / "test.pt").string()
                                : detail::concat(name_of(cfg.dataset), " test split");
  PARTRAIN_CHECK(
      test.channels == train.channels && test.height == train.height && test.width == train.width,
      UsageError, where, ": images are ", test.channels, "x", test.height, "x", test.width,
      " but the training split's are ", train.channels, "x", train.height, "x", train.width,
      cfg.dataset == DatasetKind::kImageFolder ? "; set data.image_size to bring both to one size"
                                               : "");
  if (cfg.dataset != DatasetKind::kTensors) return;
  for (std::size_t i = 0; i < test.labels.size(); ++i) {
    PARTRAIN_CHECK(test.labels[i] < train.num_classes, UsageError, where, ": \"labels\"[", i,
                   "] is ", test.labels[i], ", outside the training split's ", train.num_classes,
                   " classes (0..", train.num_classes - 1, ")");
  }
  PARTRAIN_CHECK(test.num_classes <= train.num_classes, UsageError, where, ": names ",
                 test.num_classes, " classes, the training split ", train.num_classes);
  test.num_classes = train.num_classes;
}

// data.mean / data.std (1 value for every channel, or one per channel) replace the dataset's.
void apply_config_stats(const DataConfig& cfg, ImageDataset& d) {
  for (const auto& [key, given, target] :
       {std::tuple{"mean", &cfg.mean, &d.mean}, std::tuple{"std", &cfg.std, &d.std}}) {
    if (given->empty()) continue;
    PARTRAIN_CHECK(given->size() == 1 || given->size() == static_cast<std::size_t>(d.channels),
                   UsageError, "data.", key, ": ", given->size(), " values, but ", d.name,
                   " images have ", d.channels,
                   d.channels == 1 ? std::string(" channel (give 1)")
                                   : detail::concat(" channels (give 1 or ", d.channels, ")"));
    target->assign(static_cast<std::size_t>(d.channels), 0.0f);
    for (int c = 0; c < d.channels; ++c) {
      (*target)[c] = static_cast<float>((*given)[given->size() == 1 ? 0 : c]);
    }
  }
}

}  // namespace

std::string default_root(DatasetKind dataset) {
  switch (dataset) {
    case DatasetKind::kCifar100:
      return "data/cifar-100-binary";
    case DatasetKind::kCifar10:
      return "data/cifar-10-batches-bin";
    case DatasetKind::kFashionMnist:
      return "/usr/share/datasets/fashion-mnist";
    case DatasetKind::kMnist:
      return "data/mnist";
    case DatasetKind::kImageFolder:
    case DatasetKind::kTensors:
    case DatasetKind::kSynthetic:
      break;
  }
  return "";
}

ImageDataset load_dataset(const DataConfig& cfg, bool train, std::uint64_t seed,
                          TensorFileReader tensor_reader) {
  if (!train && computes_own_stats(cfg.dataset)) {
    // The test split is normalised with, and checked against, the training split.
    return load_splits(cfg, seed, tensor_reader).test;
  }
  ImageDataset out = read_split(cfg, train, seed, tensor_reader);
  if (computes_own_stats(cfg.dataset)) compute_channel_stats(out, out.mean, out.std);
  apply_config_stats(cfg, out);
  return out;
}

DatasetSplits load_splits(const DataConfig& cfg, std::uint64_t seed,
                          TensorFileReader tensor_reader) {
  DatasetSplits splits;
  splits.train = read_split(cfg, true, seed, tensor_reader);
  splits.test = read_split(cfg, false, seed, tensor_reader);
  if (computes_own_stats(cfg.dataset)) {
    check_test_split(cfg, splits.train, splits.test);
    compute_channel_stats(splits.train, splits.train.mean, splits.train.std);
    splits.test.mean = splits.train.mean;
    splits.test.std = splits.train.std;
  }
  apply_config_stats(cfg, splits.train);
  apply_config_stats(cfg, splits.test);
  return splits;
}

void truncate_dataset(ImageDataset& dataset, std::int64_t limit) {
  if (limit <= 0 || limit >= dataset.size) return;
  dataset.size = limit;
  dataset.pixels.resize(static_cast<std::size_t>(limit * dataset.sample_bytes()));
  dataset.labels.resize(static_cast<std::size_t>(limit));
}

void compute_channel_stats(const ImageDataset& dataset, std::vector<float>& mean,
                           std::vector<float>& std) {
  const std::int64_t plane = static_cast<std::int64_t>(dataset.height) * dataset.width;
  std::vector<double> sum(static_cast<std::size_t>(dataset.channels), 0.0);
  std::vector<double> sum_sq(sum.size(), 0.0);
  for (std::int64_t i = 0; i < dataset.size; ++i) {
    const std::uint8_t* image = dataset.image(i);
    for (int c = 0; c < dataset.channels; ++c) {
      // Integer sums per plane are exact; doubles only accumulate across images.
      std::uint64_t s = 0, s2 = 0;
      for (std::int64_t p = 0; p < plane; ++p) {
        const std::uint64_t v = image[c * plane + p];
        s += v;
        s2 += v * v;
      }
      sum[c] += static_cast<double>(s);
      sum_sq[c] += static_cast<double>(s2);
    }
  }
  const double count = static_cast<double>(dataset.size) * static_cast<double>(plane);
  mean.assign(sum.size(), 0.0f);
  std.assign(sum.size(), 1.0f);
  for (std::size_t c = 0; c < sum.size() && count > 0; ++c) {
    const double m = sum[c] / count / 255.0;
    const double var = sum_sq[c] / count / (255.0 * 255.0) - m * m;
    mean[c] = static_cast<float>(m);
    // A constant channel would divide by zero; 1 leaves it merely centred.
    std[c] = var > 1e-12 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
}

}  // namespace partrain::data
