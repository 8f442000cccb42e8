#include "trainer/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "common/errors.h"
#include "trainer/config/config.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/download.h"
#include "trainer/data/idx_reader.h"
#include "trainer/data/synthetic.h"

namespace partrain::data {

namespace fs = std::filesystem;

namespace {

constexpr int kFashionMnistClasses = 10;

ImageDataset load_cifar100(const DataConfig& cfg, bool train, std::int64_t limit) {
  const std::string root = cfg.root.empty() ? default_root("cifar100") : cfg.root;
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

// Fashion-MNIST files may be plain or gzipped; the plain one wins when both exist.
std::string find_idx_file(const std::string& root, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem, stem + ".gz"}) {
    const fs::path candidate = fs::path(root) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  throw UsageError(detail::concat("fashion-mnist: ", (fs::path(root) / stem).string(),
                                  "[.gz] not found; install it with "
                                  "`apt-get install dataset-fashion-mnist` (files in ",
                                  default_root("fashion-mnist"),
                                  ") or point data.root at a folder holding the IDX files"));
}

ImageDataset load_fashion_mnist(const DataConfig& cfg, bool train, std::int64_t limit) {
  const std::string root = cfg.root.empty() ? default_root("fashion-mnist") : cfg.root;
  const std::string prefix = train ? "train" : "t10k";
  const std::string images = find_idx_file(root, prefix + "-images-idx3-ubyte");
  const std::string labels = find_idx_file(root, prefix + "-labels-idx1-ubyte");
  return read_idx_dataset(images, labels, kFashionMnistClasses, limit);
}

}  // namespace

std::string default_root(const std::string& dataset) {
  if (dataset == "cifar100") return "data/cifar-100-binary";
  if (dataset == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  return "";
}

ImageDataset load_dataset(const DataConfig& cfg, bool train, std::uint64_t seed) {
  const std::int64_t limit = train ? cfg.train_limit : cfg.test_limit;
  PARTRAIN_CHECK(limit >= 0, UsageError, "data.", train ? "train_limit" : "test_limit",
                 " must be >= 0, not ", limit);
  ImageDataset out;
  if (cfg.dataset == "cifar100") {
    out = load_cifar100(cfg, train, limit);
  } else if (cfg.dataset == "fashion-mnist") {
    out = load_fashion_mnist(cfg, train, limit);
  } else if (cfg.dataset == "synthetic") {
    SyntheticOptions options;
    options.size = train ? cfg.synthetic_train : cfg.synthetic_test;
    if (limit > 0) options.size = std::min(options.size, limit);
    options.train = train;
    options.seed = seed;
    out = generate_synthetic(options);
    if (!train) {
      // Normalise the test split with the training split's statistics, as for real data.
      options.size = cfg.synthetic_train;
      options.train = true;
      const ImageDataset train_split = generate_synthetic(options);
      out.mean = train_split.mean;
      out.std = train_split.std;
    }
  } else {
    throw UsageError(detail::concat("data.dataset '", cfg.dataset,
                                    "' is not one of cifar100, fashion-mnist, synthetic"));
  }
  out.split = train ? "train" : "test";
  return out;
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
