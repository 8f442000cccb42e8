// The dataset readers: any file is either a dataset whose sizes agree with the file or one
// UsageError, and nothing announced by a header is allocated before it is checked.
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "fuzz/scratch_file.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/idx_reader.h"

namespace partrain::fuzz {

namespace {

constexpr int kIdxClasses = 10;

void check_dataset(const data::ImageDataset& dataset, const char* what) {
  const auto image_bytes =
      static_cast<std::size_t>(dataset.channels) * dataset.height * dataset.width;
  const bool sizes_agree =
      dataset.size > 0 && dataset.labels.size() == static_cast<std::size_t>(dataset.size) &&
      dataset.pixels.size() == image_bytes * static_cast<std::size_t>(dataset.size);
  const bool labels_in_range =
      std::all_of(dataset.labels.begin(), dataset.labels.end(),
                  [&](auto label) { return label >= 0 && label < dataset.num_classes; });
  if (!sizes_agree || !labels_in_range) {
    throw InvariantBroken(std::string(what) + ": the dataset read does not agree with itself");
  }
}

}  // namespace

void fuzz_idx(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kPrefix = 3;
  if (size < kPrefix) return;
  const std::size_t rest = size - kPrefix;
  const std::size_t split = (std::size_t{data[0]} | std::size_t{data[1]} << 8) % (rest + 1);
  const std::int64_t limit = data[2] % 4;  // 0: all samples
  const std::string images = write_scratch_file("images-idx3-ubyte", data + kPrefix, split);
  const std::string labels =
      write_scratch_file("labels-idx1-ubyte", data + kPrefix + split, rest - split);
  const auto dataset = data::read_idx_dataset(images, labels, kIdxClasses, limit);
  check_dataset(dataset, "idx");
  if (dataset.channels != 1 || (limit > 0 && dataset.size > limit)) {
    throw InvariantBroken("idx: wrong channel count or limit not applied");
  }
}

void fuzz_cifar(const std::uint8_t* data, std::size_t size) {
  const auto dataset = data::read_cifar100_bin(write_scratch_file("data.bin", data, size));
  check_dataset(dataset, "cifar");
  if (static_cast<std::size_t>(dataset.size) * data::kCifarRecordBytes != size) {
    throw InvariantBroken("cifar: record count does not match the file size");
  }
}

}  // namespace partrain::fuzz
