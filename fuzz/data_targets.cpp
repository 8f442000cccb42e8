// The dataset readers: any file is either a dataset whose sizes agree with the file or one
// UsageError, and nothing announced by a header is allocated before it is checked. An image
// file decodes to no more pixels than kMaxImagePixels, whatever its format claims.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "fuzz/scratch_file.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/idx_reader.h"
#include "trainer/data/image_folder.h"

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

void fuzz_image(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  data::ImageFolderOptions options;
  options.image_size = data[0];  // 0: the image's own size
  options.threads = 1;
  const std::filesystem::path file = write_scratch_file("image/k/x.bmp", data + 1, size - 1);
  const auto dataset = data::read_image_folder(file.parent_path().parent_path().string(), options);
  check_dataset(dataset, "image");
  const auto pixels = static_cast<std::uint64_t>(dataset.height) * dataset.width;
  if (dataset.size != 1 || dataset.channels != 3 || pixels > data::kMaxImagePixels) {
    throw InvariantBroken("image: not one RGB image within the pixel limit");
  }
  if (options.image_size > 0 &&
      (dataset.height != options.image_size || dataset.width != options.image_size)) {
    throw InvariantBroken("image: not resized and cropped to image_size");
  }
}

}  // namespace partrain::fuzz
