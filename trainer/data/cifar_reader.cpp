#include "trainer/data/cifar_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/errors.h"
#include "common/atomic_file.h"

namespace partrain::data {

namespace {

// Per-channel statistics of CIFAR-100's 50000 training images (R, G, B), in [0, 1] units.
constexpr float kCifar100Mean[3] = {0.5071f, 0.4865f, 0.4409f};
constexpr float kCifar100Std[3] = {0.2673f, 0.2564f, 0.2762f};

// Records are read in blocks of this many to bound the staging buffer.
constexpr std::int64_t kBlockRecords = 1024;

}  // namespace

ImageDataset read_cifar100_bin(const std::string& path, std::int64_t limit) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  PARTRAIN_CHECK(!ec && std::filesystem::exists(status), UsageError, path, ": no such file");
  PARTRAIN_CHECK(std::filesystem::is_regular_file(status), UsageError, path,
                 ": not a regular file");
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, path, ": cannot read its size: ", ec.message());
  PARTRAIN_CHECK(file_bytes % kCifarRecordBytes == 0, UsageError, path, ": size ", file_bytes,
                 " bytes is not a whole number of ", kCifarRecordBytes, "-byte CIFAR-100 records (",
                 file_bytes / kCifarRecordBytes, " records and ", file_bytes % kCifarRecordBytes,
                 " bytes left over; truncated or not CIFAR-100)");
  PARTRAIN_CHECK(file_bytes > 0, UsageError, path, ": empty file, no CIFAR-100 records");

  std::int64_t records = static_cast<std::int64_t>(file_bytes / kCifarRecordBytes);
  if (limit > 0) records = std::min(records, limit);
  const auto pixel_bytes = static_cast<std::uint64_t>(records) * kCifarImageBytes;
  PARTRAIN_CHECK(pixel_bytes <= kMaxDatasetBytes, UsageError, path, ": ", records, " records (",
                 pixel_bytes, " bytes of pixels) exceed the ", kMaxDatasetBytes,
                 " bytes held in memory; set data.train_limit / data.test_limit");

  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open for reading");

  ImageDataset out;
  out.name = "cifar100";
  out.size = records;
  out.channels = 3;
  out.height = 32;
  out.width = 32;
  out.num_classes = kCifar100Classes;
  out.pixels.resize(pixel_bytes);
  out.labels.resize(static_cast<std::size_t>(records));
  out.mean.assign(std::begin(kCifar100Mean), std::end(kCifar100Mean));
  out.std.assign(std::begin(kCifar100Std), std::end(kCifar100Std));

  std::vector<std::uint8_t> block(static_cast<std::size_t>(kBlockRecords * kCifarRecordBytes));
  for (std::int64_t first = 0; first < records; first += kBlockRecords) {
    const std::int64_t count = std::min(kBlockRecords, records - first);
    const std::int64_t offset = first * kCifarRecordBytes;
    in.read(reinterpret_cast<char*>(block.data()), count * kCifarRecordBytes);
    // The size was checked, so a short read means the file changed or the disk failed.
    PARTRAIN_CHECK(in.gcount() == count * kCifarRecordBytes, UsageError, path,
                   ": read failed at byte ", offset + in.gcount(), " of ", file_bytes);
    for (std::int64_t k = 0; k < count; ++k) {
      const std::uint8_t* record = block.data() + k * kCifarRecordBytes;
      const std::int64_t record_offset = offset + k * kCifarRecordBytes;
      PARTRAIN_CHECK(record[0] < kCifar100CoarseClasses, UsageError, path, ": byte ", record_offset,
                     ": coarse label ", int{record[0]}, " of record ", first + k, " is outside 0..",
                     kCifar100CoarseClasses - 1);
      PARTRAIN_CHECK(record[1] < kCifar100Classes, UsageError, path, ": byte ", record_offset + 1,
                     ": fine label ", int{record[1]}, " of record ", first + k, " is outside 0..",
                     kCifar100Classes - 1);
      out.labels[static_cast<std::size_t>(first + k)] = record[1];
      std::copy(record + 2, record + kCifarRecordBytes,
                out.pixels.begin() + (first + k) * kCifarImageBytes);
    }
  }
  return out;
}

void write_cifar100_bin(const ImageDataset& dataset, const std::string& path) {
  PARTRAIN_CHECK(dataset.channels == 3 && dataset.height == 32 && dataset.width == 32, UsageError,
                 "cifar100-bin holds 3x32x32 images, not ", dataset.channels, "x", dataset.height,
                 "x", dataset.width);
  PARTRAIN_CHECK(dataset.num_classes <= kCifar100Classes, UsageError, "cifar100-bin holds at most ",
                 kCifar100Classes, " classes, not ", dataset.num_classes);
  PARTRAIN_CHECK(
      static_cast<std::int64_t>(dataset.labels.size()) == dataset.size &&
          static_cast<std::int64_t>(dataset.pixels.size()) == dataset.size * kCifarImageBytes,
      Error, "dataset '", dataset.name, "' has inconsistent sizes");

  const std::string temp = temp_path_for(path);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    PARTRAIN_CHECK(out, UsageError, "cannot write ", temp);
    std::vector<std::uint8_t> record(kCifarRecordBytes);
    for (std::int64_t i = 0; i < dataset.size; ++i) {
      const std::int64_t label = dataset.labels[static_cast<std::size_t>(i)];
      PARTRAIN_CHECK(label >= 0 && label < kCifar100Classes, Error, "sample ", i, " has label ",
                     label);
      record[0] = static_cast<std::uint8_t>(label / (kCifar100Classes / kCifar100CoarseClasses));
      record[1] = static_cast<std::uint8_t>(label);
      std::copy(dataset.image(i), dataset.image(i) + kCifarImageBytes, record.begin() + 2);
      out.write(reinterpret_cast<const char*>(record.data()), kCifarRecordBytes);
    }
    out.flush();
    if (!out) {
      out.close();
      std::error_code ec;
      std::filesystem::remove(temp, ec);
      throw UsageError(detail::concat("writing ", temp, " failed (disk full?)"));
    }
  }
  sync_file(temp);
  commit_file(temp, path);
}

}  // namespace partrain::data
