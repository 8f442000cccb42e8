#include "trainer/data/cifar_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace partrain::data {

namespace {

// Per-channel statistics of CIFAR-100's 50000 training images (R, G, B), in [0, 1] units.
constexpr float kCifar100Mean[3] = {0.5071f, 0.4865f, 0.4409f};
constexpr float kCifar100Std[3] = {0.2673f, 0.2564f, 0.2762f};
// The same for CIFAR-10's 50000 training images (the standard deviation over all pixels of a
// channel, not the often-quoted 0.2023, 0.1994, 0.2010, which averages per-image deviations).
constexpr float kCifar10Mean[3] = {0.4914f, 0.4822f, 0.4465f};
constexpr float kCifar10Std[3] = {0.2470f, 0.2435f, 0.2616f};

// Records are read in blocks of this many to bound the staging buffer.
constexpr std::int64_t kBlockRecords = 1024;

}  // namespace

namespace {

// The two CIFAR binary releases differ only in their label bytes: CIFAR-100 has a coarse and
// a fine label, CIFAR-10 one label, each followed by a 3072-byte image.
struct RecordFormat {
  const char* name;    // "CIFAR-100", for messages
  int label_bytes;     // labels before the pixels
  int label_byte;      // which of them is the class label
  int classes;         // that label's range
  int coarse_classes;  // CIFAR-100's superclass byte (0: none)
};

constexpr RecordFormat kCifar100Format{"CIFAR-100", 2, 1, kCifar100Classes, kCifar100CoarseClasses};
constexpr RecordFormat kCifar10Format{"CIFAR-10", 1, 0, kCifar10Classes, 0};

// Checks `path` and returns its number of whole records.
std::int64_t count_records(const std::string& path, const RecordFormat& format) {
  const std::int64_t record_bytes = format.label_bytes + kCifarImageBytes;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  PARTRAIN_CHECK(!ec && std::filesystem::exists(status), UsageError, path, ": no such file");
  PARTRAIN_CHECK(std::filesystem::is_regular_file(status), UsageError, path,
                 ": not a regular file");
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, path, ": cannot read its size: ", ec.message());
  PARTRAIN_CHECK(file_bytes % record_bytes == 0, UsageError, path, ": size ", file_bytes,
                 " bytes is not a whole number of ", record_bytes, "-byte ", format.name,
                 " records (", file_bytes / record_bytes, " records and ",
                 file_bytes % record_bytes, " bytes left over; truncated or not ", format.name,
                 ")");
  PARTRAIN_CHECK(file_bytes > 0, UsageError, path, ": empty file, no ", format.name, " records");
  return static_cast<std::int64_t>(file_bytes / record_bytes);
}

// Reads the first `records` records of `path` into samples first_sample.. of `out`.
void read_records(const std::string& path, const RecordFormat& format, std::int64_t records,
                  std::int64_t first_sample, ImageDataset& out) {
  const std::int64_t record_bytes = format.label_bytes + kCifarImageBytes;
  const std::int64_t file_bytes = count_records(path, format) * record_bytes;
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open for reading");
  std::vector<std::uint8_t> block(static_cast<std::size_t>(kBlockRecords * record_bytes));
  for (std::int64_t first = 0; first < records; first += kBlockRecords) {
    const std::int64_t count = std::min(kBlockRecords, records - first);
    const std::int64_t offset = first * record_bytes;
    in.read(reinterpret_cast<char*>(block.data()), count * record_bytes);
    // The size was checked, so a short read means the file changed or the disk failed.
    PARTRAIN_CHECK(in.gcount() == count * record_bytes, UsageError, path, ": read failed at byte ",
                   offset + in.gcount(), " of ", file_bytes);
    for (std::int64_t k = 0; k < count; ++k) {
      const std::uint8_t* record = block.data() + k * record_bytes;
      const std::int64_t record_offset = offset + k * record_bytes;
      if (format.coarse_classes > 0) {
        PARTRAIN_CHECK(record[0] < format.coarse_classes, UsageError, path, ": byte ",
                       record_offset, ": coarse label ", int{record[0]}, " of record ", first + k,
                       " is outside 0..", format.coarse_classes - 1);
      }
      const std::uint8_t label = record[format.label_byte];
      const char* kind = format.coarse_classes > 0 ? "fine label " : "label ";
      PARTRAIN_CHECK((label < format.classes), UsageError, path, ": byte ",
                     record_offset + format.label_byte, ": ", kind, int{label}, " of record ",
                     first + k, " is outside 0..", format.classes - 1);
      const std::int64_t sample = first_sample + first + k;
      out.labels[static_cast<std::size_t>(sample)] = label;
      std::copy(record + format.label_bytes, record + record_bytes,
                out.pixels.begin() + sample * kCifarImageBytes);
    }
  }
}

// Reads the files in order, at most `limit` records in all (0 = all), into one dataset.
ImageDataset read_cifar_files(const std::vector<std::string>& paths, const RecordFormat& format,
                              std::int64_t limit) {
  std::vector<std::int64_t> counts;
  std::int64_t records = 0;
  for (const std::string& path : paths) {
    std::int64_t count = count_records(path, format);
    if (limit > 0) count = std::min(count, limit - records);
    counts.push_back(count);
    records += count;
  }
  const auto pixel_bytes = static_cast<std::uint64_t>(records) * kCifarImageBytes;
  PARTRAIN_CHECK(pixel_bytes <= kMaxDatasetBytes, UsageError, paths.back(), ": ", records,
                 " records (", pixel_bytes, " bytes of pixels) exceed the ", kMaxDatasetBytes,
                 " bytes held in memory; set data.train_limit / data.test_limit");
  ImageDataset out;
  out.size = records;
  out.channels = 3;
  out.height = 32;
  out.width = 32;
  out.num_classes = format.classes;
  out.pixels.resize(pixel_bytes);
  out.labels.resize(static_cast<std::size_t>(records));
  std::int64_t first_sample = 0;
  for (std::size_t f = 0; f < paths.size(); ++f) {
    if (counts[f] > 0) read_records(paths[f], format, counts[f], first_sample, out);
    first_sample += counts[f];
  }
  return out;
}

}  // namespace

ImageDataset read_cifar100_bin(const std::string& path, std::int64_t limit) {
  ImageDataset out = read_cifar_files({path}, kCifar100Format, limit);
  out.name = "cifar100";
  out.mean.assign(std::begin(kCifar100Mean), std::end(kCifar100Mean));
  out.std.assign(std::begin(kCifar100Std), std::end(kCifar100Std));
  return out;
}

ImageDataset read_cifar10_bin(const std::vector<std::string>& paths, std::int64_t limit) {
  PARTRAIN_CHECK(!paths.empty(), Error, "read_cifar10_bin needs at least one file");
  ImageDataset out = read_cifar_files(paths, kCifar10Format, limit);
  out.name = "cifar10";
  out.mean.assign(std::begin(kCifar10Mean), std::end(kCifar10Mean));
  out.std.assign(std::begin(kCifar10Std), std::end(kCifar10Std));
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
