#include "trainer/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "common/errors.h"

namespace partrain::data {

namespace {

// Deflate cannot expand data by more than about 1032:1, so a gzip file of N bytes holds at
// most ~1032 N bytes; a header that announces more is lying, and we say so before
// allocating anything.
constexpr std::uint64_t kMaxDeflateRatio = 1032;
constexpr unsigned kReadChunk = 1u << 24;

// Fashion-MNIST's published statistics of its 60000 training images, in [0, 1] units.
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

// An IDX file opened through zlib, which reads plain files transparently. Byte offsets in
// messages are offsets in the uncompressed data, which for a plain file are file offsets.
class IdxFile {
 public:
  explicit IdxFile(const std::string& path) : path_(path) {
    std::error_code ec;
    PARTRAIN_CHECK(std::filesystem::is_regular_file(path, ec), UsageError, path, ": no such file");
    file_bytes_ = std::filesystem::file_size(path, ec);
    PARTRAIN_CHECK(!ec, UsageError, path, ": cannot read its size: ", ec.message());
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      unsigned char head[2] = {0, 0};
      gzipped_ = std::fread(head, 1, 2, f) == 2 && head[0] == 0x1f && head[1] == 0x8b;
      std::fclose(f);
    }
    file_ = gzopen(path.c_str(), "rb");
    PARTRAIN_CHECK(file_ != nullptr, UsageError, path, ": cannot open for reading");
  }
  ~IdxFile() {
    if (file_ != nullptr) gzclose(file_);
  }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t offset() const { return offset_; }

  // Reads up to `bytes` bytes; returns how many arrived before the end of the data. Corrupt
  // compressed data throws with the zlib message and the compressed offset reached.
  std::uint64_t read_some(std::uint8_t* out, std::uint64_t bytes) {
    std::uint64_t done = 0;
    while (done < bytes) {
      const auto want = static_cast<unsigned>(std::min<std::uint64_t>(bytes - done, kReadChunk));
      const int got = gzread(file_, out + done, want);
      int errnum = Z_OK;
      const char* message = got > 0 ? nullptr : gzerror(file_, &errnum);
      // A cut-off gzip stream ends with Z_BUF_ERROR ("unexpected end of file") and a short
      // count rather than -1; both are corrupt input.
      if (got < 0 || (got == 0 && errnum != Z_OK)) {
        std::string reason = message != nullptr ? message : "unknown zlib error";
        if (reason.rfind(path_ + ": ", 0) == 0) reason.erase(0, path_.size() + 2);
        throw UsageError(detail::concat(path_, ": corrupt gzip data at uncompressed byte ",
                                        offset_ + done, " (compressed byte ~", gzoffset(file_),
                                        " of ", file_bytes_, "): ", reason));
      }
      if (got == 0) break;
      done += static_cast<std::uint64_t>(got);
    }
    offset_ += done;
    return done;
  }

  void read_exact(std::uint8_t* out, std::uint64_t bytes, const char* what) {
    const std::uint64_t start = offset_;
    const std::uint64_t got = read_some(out, bytes);
    PARTRAIN_CHECK(got == bytes, UsageError, path_, ": truncated at byte ", start + got,
                   ": expected ", bytes, " bytes of ", what, " from byte ", start, ", found ", got);
  }

  std::uint32_t read_u32(const char* what) {
    std::array<std::uint8_t, 4> b{};
    read_exact(b.data(), 4, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
           std::uint32_t{b[3]};
  }

  // Checks that the file can hold `data_bytes` bytes after the header, before anything of
  // that size is allocated.
  void check_capacity(std::uint64_t header_bytes, std::uint64_t data_bytes, const char* what) {
    if (gzipped_) {
      const std::uint64_t most = file_bytes_ * kMaxDeflateRatio + 1024;
      PARTRAIN_CHECK(data_bytes <= most, UsageError, path_, ": header announces ", data_bytes,
                     " bytes of ", what, ", more than a ", file_bytes_,
                     "-byte gzip file can hold (truncated or corrupt header)");
    } else {
      const std::uint64_t expected = header_bytes + data_bytes;
      PARTRAIN_CHECK(file_bytes_ >= expected, UsageError, path_, ": truncated at byte ",
                     file_bytes_, ": header announces ", data_bytes, " bytes of ", what,
                     ", so the file should be ", expected, " bytes");
      PARTRAIN_CHECK(file_bytes_ == expected, UsageError, path_, ": ", file_bytes_ - expected,
                     " unexpected bytes after byte ", expected, " (the end of the ", what,
                     " the header announces)");
    }
  }

  // After all announced data was read: nothing may follow (reading on also makes zlib
  // verify the gzip trailer's CRC and length).
  void check_end(const char* what) {
    std::uint8_t extra[1];
    const std::uint64_t end = offset_;
    PARTRAIN_CHECK(read_some(extra, 1) == 0, UsageError, path_, ": unexpected bytes after byte ",
                   end, " (the end of the ", what, " the header announces)");
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t offset_ = 0;
  bool gzipped_ = false;
};

void check_magic(IdxFile& file, std::uint32_t expected, const char* kind) {
  const std::uint32_t magic = file.read_u32("IDX magic number");
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08x", magic);
  PARTRAIN_CHECK(magic == expected, UsageError, file.path(), ": byte 0: IDX magic ", hex, " (",
                 magic, ") is not ", expected, " (", kind,
                 "); not an IDX file of that kind, or a gzip file that lost its header");
}

}  // namespace

ImageDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              int num_classes, std::int64_t limit) {
  IdxFile images(images_path);
  check_magic(images, kIdxImagesMagic, "unsigned-byte images, 3 dimensions");
  const std::uint32_t count = images.read_u32("image count");
  const std::uint32_t rows = images.read_u32("image rows");
  const std::uint32_t cols = images.read_u32("image columns");
  PARTRAIN_CHECK(count > 0, UsageError, images_path, ": byte 4: image count is 0");
  PARTRAIN_CHECK(rows > 0 && cols > 0 && rows <= 4096 && cols <= 4096, UsageError, images_path,
                 ": byte 8: image size ", rows, "x", cols, " is outside 1x1 .. 4096x4096");
  const std::uint64_t image_bytes = std::uint64_t{rows} * cols;         // < 2^24, no overflow
  const std::uint64_t data_bytes = std::uint64_t{count} * image_bytes;  // < 2^56
  images.check_capacity(16, data_bytes, "image data");

  IdxFile labels(labels_path);
  check_magic(labels, kIdxLabelsMagic, "unsigned-byte labels, 1 dimension");
  const std::uint32_t label_count = labels.read_u32("label count");
  PARTRAIN_CHECK(label_count == count, UsageError, labels_path, ": byte 4: ", label_count,
                 " labels, but ", images_path, " holds ", count, " images");
  labels.check_capacity(8, label_count, "labels");

  const std::uint64_t keep =
      limit > 0 ? std::min<std::uint64_t>(count, static_cast<std::uint64_t>(limit)) : count;
  PARTRAIN_CHECK(keep * image_bytes <= kMaxDatasetBytes, UsageError, images_path, ": ", keep,
                 " images of ", rows, "x", cols, " (", keep * image_bytes, " bytes) exceed the ",
                 kMaxDatasetBytes, " bytes held in memory; set data.train_limit / data.test_limit");

  ImageDataset out;
  out.name = "fashion-mnist";
  out.size = static_cast<std::int64_t>(keep);
  out.channels = 1;
  out.height = static_cast<int>(rows);
  out.width = static_cast<int>(cols);
  out.num_classes = num_classes;
  out.mean = {kFashionMnistMean};
  out.std = {kFashionMnistStd};
  out.pixels.resize(keep * image_bytes);
  images.read_exact(out.pixels.data(), keep * image_bytes, "image data");
  if (keep == count) images.check_end("image data");

  std::vector<std::uint8_t> raw(keep);
  labels.read_exact(raw.data(), keep, "labels");
  if (keep == count) labels.check_end("labels");
  out.labels.resize(keep);
  for (std::uint64_t i = 0; i < keep; ++i) {
    PARTRAIN_CHECK(raw[i] < num_classes, UsageError, labels_path, ": byte ", 8 + i, ": label ",
                   int{raw[i]}, " of sample ", i, " is outside 0..", num_classes - 1);
    out.labels[i] = raw[i];
  }
  return out;
}

}  // namespace partrain::data
