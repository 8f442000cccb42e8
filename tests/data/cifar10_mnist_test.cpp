// cifar10 (the binary release: five training batches and a test batch) and mnist (IDX files,
// plain or gzipped) through load_dataset, on good and broken files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>

#include "tests/data/scratch_files.h"
#include "trainer/config/config.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/dataset.h"
#include "trainer/data/idx_reader.h"

namespace partrain::data {
namespace {

namespace fs = std::filesystem;
using test_files::usage_error_of;
using test_files::write_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;

// `records` CIFAR-10 records; record r of batch b has label (b + r) % 10 and every pixel byte
// equal to 10 b + r.
std::vector<std::uint8_t> cifar10_batch(int b, int records) {
  std::vector<std::uint8_t> out;
  for (int r = 0; r < records; ++r) {
    out.push_back(static_cast<std::uint8_t>((b + r) % 10));
    out.insert(out.end(), kCifarImageBytes, static_cast<std::uint8_t>(10 * b + r));
  }
  return out;
}

class Cifar10 : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int b = 1; b <= 5; ++b) {
      write_bytes(dir / ("data_batch_" + std::to_string(b) + ".bin"), cifar10_batch(b, 3));
    }
    write_bytes(dir / "test_batch.bin", cifar10_batch(0, 4));
    cfg.dataset = DatasetKind::kCifar10;
    cfg.root = dir.path();
  }
  ScratchDir dir;
  DataConfig cfg;
};

TEST_F(Cifar10, ReadsTheFiveTrainingBatchesInOrderAndTheTestBatch) {
  const ImageDataset train = load_dataset(cfg, true, 0);
  EXPECT_EQ(train.name, "cifar10");
  EXPECT_EQ(train.size, 15);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 32);
  for (int i = 0; i < 15; ++i) {
    const int b = 1 + i / 3, r = i % 3;
    EXPECT_EQ(train.labels[i], (b + r) % 10) << i;
    EXPECT_EQ(train.image(i)[0], 10 * b + r) << i;
    EXPECT_EQ(train.image(i)[kCifarImageBytes - 1], 10 * b + r) << i;
  }
  // CIFAR-10's own published statistics, also for the test split.
  EXPECT_EQ(train.mean, (std::vector<float>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(train.std, (std::vector<float>{0.2470f, 0.2435f, 0.2616f}));
  const ImageDataset test = load_dataset(cfg, false, 0);
  EXPECT_EQ(test.size, 4);
  EXPECT_EQ(test.mean, train.mean);
  EXPECT_EQ(test.labels, (std::vector<std::int64_t>{0, 1, 2, 3}));

  // A limit that ends inside the third batch reads only what it keeps.
  cfg.train_limit = 7;
  const ImageDataset seven = load_dataset(cfg, true, 0);
  EXPECT_EQ(seven.size, 7);
  EXPECT_EQ(seven.image(6)[0], 30);
  fs::remove(dir / "data_batch_5.bin");
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              AllOf(HasSubstr("data_batch_5.bin not found"), HasSubstr("cifar-10-binary.tar.gz")));
}

TEST_F(Cifar10, BrokenBatchesNameTheFileAndTheByte) {
  std::vector<std::uint8_t> bad = cifar10_batch(3, 3);
  bad[2 * kCifar10RecordBytes] = 10;  // label of record 2
  write_bytes(dir / "data_batch_3.bin", bad);
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              HasSubstr("data_batch_3.bin: byte " + std::to_string(2 * kCifar10RecordBytes) +
                        ": label 10 of record 2 is outside 0..9"));
  bad = cifar10_batch(3, 3);
  bad.pop_back();
  write_bytes(dir / "data_batch_3.bin", bad);
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              HasSubstr("data_batch_3.bin: size 9218 bytes is not a whole number of 3073-byte "
                        "CIFAR-10 records (2 records and 3072 bytes left over"));
  write_bytes(dir / "test_batch.bin", {});
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, false, 0); }),
              HasSubstr("test_batch.bin: empty file"));
  // A CIFAR-100 file is not CIFAR-10: 3074-byte records do not divide 3 x 3073 bytes.
  write_bytes(dir / "test_batch.bin", std::vector<std::uint8_t>(3 * kCifarRecordBytes, 0));
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, false, 0); }),
              HasSubstr("not a whole number of 3073-byte CIFAR-10 records"));
}

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

std::vector<std::uint8_t> idx_images(std::uint32_t n) {
  std::vector<std::uint8_t> out;
  put_u32(out, kIdxImagesMagic);
  put_u32(out, n);
  put_u32(out, 28);
  put_u32(out, 28);
  for (std::uint32_t i = 0; i < n; ++i)
    out.insert(out.end(), 28 * 28, static_cast<std::uint8_t>(i));
  return out;
}

std::vector<std::uint8_t> idx_labels(std::uint32_t n) {
  std::vector<std::uint8_t> out;
  put_u32(out, kIdxLabelsMagic);
  put_u32(out, n);
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(static_cast<std::uint8_t>((7 * i) % 10));
  return out;
}

TEST(Mnist, ReadsIdxFilesPlainOrGzippedWithMnistStatistics) {
  ScratchDir dir;
  write_bytes(dir / "train-images-idx3-ubyte.gz", test_files::gzip_bytes(idx_images(12)));
  write_bytes(dir / "train-labels-idx1-ubyte.gz", test_files::gzip_bytes(idx_labels(12)));
  write_bytes(dir / "t10k-images-idx3-ubyte", idx_images(5));
  write_bytes(dir / "t10k-labels-idx1-ubyte", idx_labels(5));
  DataConfig cfg;
  cfg.dataset = DatasetKind::kMnist;
  cfg.root = dir.path();
  const ImageDataset train = load_dataset(cfg, true, 0);
  EXPECT_EQ(train.name, "mnist");
  EXPECT_EQ(train.size, 12);
  EXPECT_EQ(train.channels, 1);
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_EQ(train.labels[3], 1);
  EXPECT_EQ(train.image(11)[783], 11);
  EXPECT_EQ(train.mean, (std::vector<float>{0.1307f}));
  EXPECT_EQ(train.std, (std::vector<float>{0.3081f}));
  EXPECT_EQ(load_dataset(cfg, false, 0).size, 5);
  cfg.mean = {0.5};
  cfg.std = {0.25};
  EXPECT_EQ(load_dataset(cfg, false, 0).std, (std::vector<float>{0.25f}));
}

TEST(Mnist, BrokenFilesNameTheFileAndTheByte) {
  ScratchDir dir;
  DataConfig cfg;
  cfg.dataset = DatasetKind::kMnist;
  cfg.root = dir.path();
  EXPECT_THAT(
      usage_error_of([&] { load_dataset(cfg, true, 0); }),
      AllOf(HasSubstr(dir / "train-images-idx3-ubyte[.gz] not found"), HasSubstr("MNIST release")));
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(4));
  std::vector<std::uint8_t> labels = idx_labels(4);
  labels[8 + 2] = 12;
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              HasSubstr("train-labels-idx1-ubyte: byte 10: label 12 of sample 2 is outside 0..9"));
  std::vector<std::uint8_t> images = idx_images(4);
  images.resize(images.size() - 100);
  write_bytes(dir / "train-images-idx3-ubyte", images);
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              HasSubstr("train-images-idx3-ubyte: truncated at byte 3052"));
  images = idx_images(4);
  images[3] = 0x01;  // the magic of a 1-dimensional file
  write_bytes(dir / "train-images-idx3-ubyte", images);
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, true, 0); }),
              HasSubstr("train-images-idx3-ubyte: byte 0: IDX magic 0x00000801"));
}

}  // namespace
}  // namespace partrain::data
