#include "trainer/data/idx_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>

#include "tests/data/scratch_files.h"

namespace partrain::data {
namespace {

using test_files::gzip_bytes;
using test_files::usage_error_of;
using test_files::write_bytes;
using ::testing::HasSubstr;
using testing::ScratchDir;

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

// n images of rows x cols, pixel p of image i = (3 i + p) % 256.
std::vector<std::uint8_t> make_images(std::uint32_t n, std::uint32_t rows, std::uint32_t cols) {
  std::vector<std::uint8_t> out;
  put_u32(out, kIdxImagesMagic);
  put_u32(out, n);
  put_u32(out, rows);
  put_u32(out, cols);
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::uint32_t p = 0; p < rows * cols; ++p)
      out.push_back(static_cast<std::uint8_t>((3 * i + p) % 256));
  }
  return out;
}

std::vector<std::uint8_t> make_labels(std::uint32_t n) {
  std::vector<std::uint8_t> out;
  put_u32(out, kIdxLabelsMagic);
  put_u32(out, n);
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(static_cast<std::uint8_t>(i % 10));
  return out;
}

class IdxReader : public ::testing::Test {
 protected:
  // Writes images/labels (gzipped if gz) and reads them back.
  ImageDataset read(const std::vector<std::uint8_t>& images,
                    const std::vector<std::uint8_t>& labels, bool gz, std::int64_t limit = 0) {
    write_bytes(images_path(gz), gz ? gzip_bytes(images) : images);
    write_bytes(labels_path(gz), gz ? gzip_bytes(labels) : labels);
    return read_idx_dataset(images_path(gz), labels_path(gz), 10, limit);
  }
  std::string images_path(bool gz) const { return dir_ / (gz ? "img.gz" : "img"); }
  std::string labels_path(bool gz) const { return dir_ / (gz ? "lbl.gz" : "lbl"); }
  std::string error_of(const std::vector<std::uint8_t>& images,
                       const std::vector<std::uint8_t>& labels, bool gz) {
    return usage_error_of([&] { read(images, labels, gz); });
  }
  ScratchDir dir_;
};

TEST_F(IdxReader, ReadsPlainAndGzippedFilesAlike) {
  for (bool gz : {false, true}) {
    SCOPED_TRACE(gz ? "gzip" : "plain");
    const ImageDataset d = read(make_images(12, 5, 7), make_labels(12), gz);
    EXPECT_EQ(d.size, 12);
    EXPECT_EQ(d.channels, 1);
    EXPECT_EQ(d.height, 5);
    EXPECT_EQ(d.width, 7);
    EXPECT_EQ(d.num_classes, 10);
    ASSERT_EQ(d.pixels.size(), 12u * 35u);
    EXPECT_EQ(d.image(4)[0], 12);
    EXPECT_EQ(d.image(11)[34], (33 + 34) % 256);
    EXPECT_EQ(d.labels[11], 1);
    EXPECT_FLOAT_EQ(d.mean[0], 0.2860f);
  }
}

TEST_F(IdxReader, LimitReadsOnlyAPrefix) {
  const ImageDataset d = read(make_images(12, 4, 4), make_labels(12), true, 5);
  EXPECT_EQ(d.size, 5);
  EXPECT_EQ(d.labels.size(), 5u);
  EXPECT_EQ(d.image(4)[1], 13);
}

TEST_F(IdxReader, WrongMagicNamesByteZero) {
  auto images = make_images(2, 3, 3);
  images[2] = 0x09;  // type byte
  for (bool gz : {false, true}) {
    EXPECT_THAT(error_of(images, make_labels(2), gz),
                HasSubstr(": byte 0: IDX magic 0x00000903 (2307) is not 2051"));
  }
  // Label and image files swapped.
  EXPECT_THAT(error_of(make_labels(2), make_images(2, 3, 3), false),
              HasSubstr("IDX magic 0x00000801 (2049) is not 2051"));
}

TEST_F(IdxReader, TruncatedPlainFileNamesTheOffsetAndExpectedSize) {
  auto images = make_images(4, 3, 3);  // 16 + 36 bytes
  images.resize(40);
  EXPECT_THAT(error_of(images, make_labels(4), false),
              HasSubstr("img: truncated at byte 40: header announces 36 bytes of image data, "
                        "so the file should be 52 bytes"));
  images = make_images(4, 3, 3);
  images.push_back(1);
  EXPECT_THAT(error_of(images, make_labels(4), false),
              HasSubstr("1 unexpected bytes after byte 52"));
  EXPECT_THAT(error_of({0, 0, 8}, make_labels(4), false),
              HasSubstr("truncated at byte 3: expected 4 bytes of IDX magic number"));
}

TEST_F(IdxReader, TruncatedGzipContentNamesTheOffset) {
  // A complete gzip stream whose content is short: caught after decompression.
  auto images = make_images(4, 3, 3);
  images.resize(45);
  EXPECT_THAT(error_of(images, make_labels(4), true),
              HasSubstr("img.gz: truncated at byte 45: expected 36 bytes of image data from "
                        "byte 16, found 29"));
}

TEST_F(IdxReader, CorruptGzipIsOneClearError) {
  auto gz = gzip_bytes(make_images(50, 10, 10));
  // Cut the compressed stream in the middle.
  std::vector<std::uint8_t> cut(gz.begin(),
                                gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
  write_bytes(images_path(true), cut);
  write_bytes(labels_path(true), gzip_bytes(make_labels(50)));
  std::string message =
      usage_error_of([&] { read_idx_dataset(images_path(true), labels_path(true), 10); });
  EXPECT_THAT(message, HasSubstr("img.gz: corrupt gzip data at uncompressed byte "));
  EXPECT_THAT(message, HasSubstr("unexpected end of file"));

  // Flip bytes inside the deflate data: a bad block or a CRC mismatch, never a crash.
  gz = gzip_bytes(make_images(50, 10, 10));
  for (std::size_t i = 20; i < gz.size() - 8; i += 7) gz[i] ^= 0x5a;
  write_bytes(images_path(true), gz);
  message = usage_error_of([&] { read_idx_dataset(images_path(true), labels_path(true), 10); });
  EXPECT_THAT(message, HasSubstr("img.gz:"));

  // A damaged CRC trailer is caught too (only the last 8 bytes differ).
  gz = gzip_bytes(make_images(50, 10, 10));
  gz[gz.size() - 6] ^= 0xff;
  write_bytes(images_path(true), gz);
  EXPECT_THAT(usage_error_of([&] { read_idx_dataset(images_path(true), labels_path(true), 10); }),
              HasSubstr("incorrect data check"));
}

TEST_F(IdxReader, HugeHeaderDimensionsAreRefusedBeforeAllocating) {
  // 4e9 images of 4096x4096 in a 16-byte file, plain and gzipped.
  std::vector<std::uint8_t> header;
  put_u32(header, kIdxImagesMagic);
  put_u32(header, 4000000000u);
  put_u32(header, 4096);
  put_u32(header, 4096);
  EXPECT_THAT(error_of(header, make_labels(2), false),
              HasSubstr("header announces 67108864000000000 bytes of image data"));
  EXPECT_THAT(error_of(header, make_labels(2), true), HasSubstr("more than a"));
  // Dimensions beyond any image we accept.
  header.clear();
  put_u32(header, kIdxImagesMagic);
  put_u32(header, 1);
  put_u32(header, 0xffffffffu);
  put_u32(header, 0xffffffffu);
  EXPECT_THAT(error_of(header, make_labels(1), false),
              HasSubstr("byte 8: image size 4294967295x4294967295 is outside"));
  // Many small images announced in a small gzip file.
  header.clear();
  put_u32(header, kIdxImagesMagic);
  put_u32(header, 3000000000u);
  put_u32(header, 28);
  put_u32(header, 28);
  EXPECT_THAT(error_of(header, make_labels(2), true), HasSubstr("-byte gzip file can hold"));
}

TEST_F(IdxReader, LabelProblemsNameTheFileAndOffset) {
  EXPECT_THAT(error_of(make_images(3, 2, 2), make_labels(4), false),
              HasSubstr("lbl: byte 4: 4 labels, but"));
  auto labels = make_labels(5);
  labels[8 + 3] = 10;
  EXPECT_THAT(error_of(make_images(5, 2, 2), labels, true),
              HasSubstr("lbl.gz: byte 11: label 10 of sample 3 is outside 0..9"));
}

// Debian's dataset-fashion-mnist package; skipped where it is not installed.
TEST(FashionMnistFiles, RealFilesHaveTheirPublishedShapeAndStatistics) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(root + "/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  }
  const ImageDataset test = read_idx_dataset(root + "/t10k-images-idx3-ubyte.gz",
                                             root + "/t10k-labels-idx1-ubyte.gz", 10);
  EXPECT_EQ(test.size, 10000);
  EXPECT_EQ(test.height, 28);
  EXPECT_EQ(test.width, 28);
  std::vector<int> per_class(10, 0);
  for (auto label : test.labels) per_class[static_cast<std::size_t>(label)]++;
  for (int count : per_class) EXPECT_EQ(count, 1000);
  const ImageDataset train = read_idx_dataset(root + "/train-images-idx3-ubyte.gz",
                                              root + "/train-labels-idx1-ubyte.gz", 10);
  EXPECT_EQ(train.size, 60000);
  std::vector<float> mean, std;
  compute_channel_stats(train, mean, std);
  // The constants the reader hands out are the training set's real statistics.
  EXPECT_NEAR(mean[0], train.mean[0], 5e-4);
  EXPECT_NEAR(std[0], train.std[0], 5e-4);
}

}  // namespace
}  // namespace partrain::data
