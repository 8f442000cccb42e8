#include "trainer/data/cifar_reader.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/scratch_files.h"

namespace partrain::data {
namespace {

using test_files::usage_error_of;
using test_files::write_bytes;
using ::testing::HasSubstr;
using testing::ScratchDir;

// Record i: coarse label i % 20, fine label (7 * i) % 100, pixel p = (i + p) % 251.
std::vector<std::uint8_t> make_records(int n) {
  std::vector<std::uint8_t> bytes;
  for (int i = 0; i < n; ++i) {
    bytes.push_back(static_cast<std::uint8_t>(i % 20));
    bytes.push_back(static_cast<std::uint8_t>((7 * i) % 100));
    for (int p = 0; p < kCifarImageBytes; ++p)
      bytes.push_back(static_cast<std::uint8_t>((i + p) % 251));
  }
  return bytes;
}

TEST(CifarReader, ReadsRecordsAsPlanarImagesWithFineLabels) {
  ScratchDir dir;
  write_bytes(dir / "train.bin", make_records(5));
  const ImageDataset d = read_cifar100_bin(dir / "train.bin");
  EXPECT_EQ(d.size, 5);
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.height, 32);
  EXPECT_EQ(d.width, 32);
  EXPECT_EQ(d.num_classes, 100);
  ASSERT_EQ(d.pixels.size(), 5u * 3072u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(d.labels[i], (7 * i) % 100);
    // R plane first: byte 0 of the image is R(0,0), byte 1024 is G(0,0), 3071 is B(31,31).
    EXPECT_EQ(d.image(i)[0], i % 251);
    EXPECT_EQ(d.image(i)[1024], (i + 1024) % 251);
    EXPECT_EQ(d.image(i)[3071], (i + 3071) % 251);
  }
  // CIFAR-100's published training statistics, per channel.
  ASSERT_EQ(d.mean.size(), 3u);
  EXPECT_FLOAT_EQ(d.mean[0], 0.5071f);
  EXPECT_FLOAT_EQ(d.std[2], 0.2762f);
}

TEST(CifarReader, LimitKeepsTheFirstRecords) {
  ScratchDir dir;
  write_bytes(dir / "train.bin", make_records(6));
  const ImageDataset d = read_cifar100_bin(dir / "train.bin", 2);
  EXPECT_EQ(d.size, 2);
  EXPECT_EQ(d.labels[1], 7);
  EXPECT_EQ(d.pixels.size(), 2u * 3072u);
}

TEST(CifarReader, SizeNotAWholeNumberOfRecordsSaysSo) {
  ScratchDir dir;
  auto bytes = make_records(3);
  bytes.resize(bytes.size() - 100);  // truncated
  write_bytes(dir / "train.bin", bytes);
  const std::string message = usage_error_of([&] { read_cifar100_bin(dir / "train.bin"); });
  EXPECT_THAT(message, HasSubstr("train.bin: size 9122 bytes is not a whole number of 3074-byte"));
  EXPECT_THAT(message, HasSubstr("2 records and 2974 bytes left over"));

  bytes = make_records(2);
  bytes.push_back(0);  // one byte too many
  write_bytes(dir / "test.bin", bytes);
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir / "test.bin"); }),
              HasSubstr("size 6149 bytes is not a whole number"));
}

TEST(CifarReader, LabelOutOfRangeNamesItsByteOffset) {
  ScratchDir dir;
  auto bytes = make_records(4);
  bytes[2 * kCifarRecordBytes + 1] = 100;  // fine label of record 2
  write_bytes(dir / "train.bin", bytes);
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir / "train.bin"); }),
              HasSubstr("train.bin: byte 6149: fine label 100 of record 2 is outside 0..99"));
  bytes = make_records(4);
  bytes[3 * kCifarRecordBytes] = 200;  // coarse label of record 3
  write_bytes(dir / "train.bin", bytes);
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir / "train.bin"); }),
              HasSubstr("byte 9222: coarse label 200 of record 3 is outside 0..19"));
}

TEST(CifarReader, EmptyMissingAndDirectoryAreErrors) {
  ScratchDir dir;
  write_bytes(dir / "empty.bin", {});
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir / "empty.bin"); }),
              HasSubstr("empty file"));
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir / "nope.bin"); }),
              HasSubstr("nope.bin: no such file"));
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(dir.path()); }),
              HasSubstr("not a regular file"));
}

TEST(CifarReader, OversizedFileIsRefusedBeforeAllocating) {
  // A sparse file of ~1.5M records (4.4 GiB) costs no disk but would need 4.4 GiB of memory.
  ScratchDir dir;
  const std::string path = dir / "train.bin";
  write_bytes(path, {});
  const std::uintmax_t records = (kMaxDatasetBytes / kCifarImageBytes) + 10;
  std::filesystem::resize_file(path, records * kCifarRecordBytes);
  EXPECT_THAT(usage_error_of([&] { read_cifar100_bin(path); }),
              HasSubstr("bytes held in memory; set data.train_limit"));
  // With a limit the same file is fine (its zero bytes are valid labels and pixels).
  const ImageDataset d = read_cifar100_bin(path, 3);
  EXPECT_EQ(d.size, 3);
  EXPECT_EQ(d.labels[2], 0);
}

TEST(CifarReader, WriteThenReadRoundTrips) {
  ScratchDir dir;
  write_bytes(dir / "in.bin", make_records(7));
  const ImageDataset d = read_cifar100_bin(dir / "in.bin");
  write_cifar100_bin(d, dir / "out.bin");
  const auto written = test_files::read_bytes(dir / "out.bin");
  ASSERT_EQ(written.size(), 7u * kCifarRecordBytes);
  const ImageDataset back = read_cifar100_bin(dir / "out.bin");
  EXPECT_EQ(back.labels, d.labels);
  EXPECT_EQ(back.pixels, d.pixels);
  // The coarse byte is fine / 5.
  EXPECT_EQ(written[3 * kCifarRecordBytes], static_cast<std::uint8_t>(((7 * 3) % 100) / 5));
  // Nothing but the final file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path()))
    ++files;
  EXPECT_EQ(files, 2);
}

}  // namespace
}  // namespace partrain::data
