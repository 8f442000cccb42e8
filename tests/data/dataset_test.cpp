#include "trainer/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>

#include "tests/data/loopback_http_server.h"
#include "tests/data/scratch_files.h"
#include "tests/data/tar_gz.h"
#include "trainer/config/config.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/download.h"
#include "trainer/data/synthetic.h"

namespace partrain::data {
namespace {

namespace fs = std::filesystem;
using test_files::usage_error_of;
using ::testing::HasSubstr;
using testing::ScratchDir;

DataConfig synthetic_config(std::int64_t train, std::int64_t test) {
  DataConfig cfg;
  cfg.dataset = DatasetKind::kSynthetic;
  cfg.synthetic_train = train;
  cfg.synthetic_test = test;
  return cfg;
}

TEST(LoadDataset, SyntheticHonoursSizesLimitsAndSeed) {
  DataConfig cfg = synthetic_config(300, 120);
  const ImageDataset train = load_dataset(cfg, true, 9);
  const ImageDataset test = load_dataset(cfg, false, 9);
  EXPECT_EQ(train.size, 300);
  EXPECT_EQ(train.split, "train");
  EXPECT_EQ(test.size, 120);
  EXPECT_EQ(test.split, "test");
  SyntheticOptions o;
  o.size = 300;
  o.seed = 9;
  EXPECT_EQ(train.pixels, generate_synthetic(o).pixels);
  EXPECT_EQ(test.mean, train.mean);  // the test split is normalised like the training split
  EXPECT_EQ(test.std, train.std);
  cfg.train_limit = 50;
  EXPECT_EQ(load_dataset(cfg, true, 9).size, 50);
  cfg.test_limit = -1;
  EXPECT_THAT(usage_error_of([&] { load_dataset(cfg, false, 9); }),
              HasSubstr("data.test_limit must be >= 0"));
}

TEST(LoadDataset, Cifar100ReadsItsRootAndAppliesLimits) {
  ScratchDir dir;
  const std::string root = dir / "cifar-100-binary";
  fs::create_directories(root);
  SyntheticOptions o;
  o.size = 40;
  write_cifar100_bin(generate_synthetic(o), root + "/train.bin");
  o.size = 10;
  o.train = false;
  write_cifar100_bin(generate_synthetic(o), root + "/test.bin");
  DataConfig cfg;
  cfg.dataset = DatasetKind::kCifar100;
  cfg.root = root;
  cfg.train_limit = 25;
  const ImageDataset train = load_dataset(cfg, true, 0);
  EXPECT_EQ(train.size, 25);
  EXPECT_EQ(train.name, "cifar100");
  EXPECT_EQ(load_dataset(cfg, false, 0).size, 10);
}

TEST(LoadDataset, MissingDatasetsSayWhereTheyLookedAndHowToGetThem) {
  ScratchDir dir;
  DataConfig cfg;
  cfg.dataset = DatasetKind::kCifar100;
  cfg.root = dir / "cifar-100-binary";
  std::string message = usage_error_of([&] { load_dataset(cfg, true, 0); });
  EXPECT_THAT(message, HasSubstr(cfg.root + "/train.bin not found"));
  EXPECT_THAT(message, HasSubstr("`partrain data fetch cifar100 --dir " + dir.string() + "`"));
  EXPECT_THAT(message, HasSubstr("data.download: true"));

  cfg.dataset = DatasetKind::kFashionMnist;
  cfg.root = dir / "fmnist";
  message = usage_error_of([&] { load_dataset(cfg, false, 0); });
  EXPECT_THAT(message, HasSubstr(cfg.root + "/t10k-images-idx3-ubyte[.gz] not found"));
  EXPECT_THAT(message, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(LoadDataset, DownloadTrueFetchesMissingCifar100) {
  SyntheticOptions o;
  o.size = 6;
  ScratchDir staging;
  write_cifar100_bin(generate_synthetic(o), staging / "train.bin");
  write_cifar100_bin(generate_synthetic(o), staging / "test.bin");
  const auto archive = test_files::make_tar_gz(
      {test_files::TarEntry::file("cifar-100-binary/train.bin",
                                  test_files::read_bytes(staging / "train.bin")),
       test_files::TarEntry::file("cifar-100-binary/test.bin",
                                  test_files::read_bytes(staging / "test.bin"))});
  test_files::write_bytes(staging / "a.tgz", archive);
  test_files::LoopbackHttpServer server({{"/a.tgz", archive}});

  ScratchDir dir;
  DataConfig cfg;
  cfg.dataset = DatasetKind::kCifar100;
  cfg.root = dir / "somewhere/cifar";
  cfg.download = true;
  cfg.url = server.url("/a.tgz") + "#md5=" + md5_file(staging / "a.tgz");
  const ImageDataset train = load_dataset(cfg, true, 0);
  EXPECT_EQ(train.size, 6);
  EXPECT_EQ(server.requests(), 1);
  EXPECT_EQ(load_dataset(cfg, false, 0).size, 6);
  EXPECT_EQ(server.requests(), 1);  // present now: no second download
}

TEST(LoadDataset, FashionMnistFromItsDefaultRoot) {
  if (!fs::exists(default_root(DatasetKind::kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  }
  DataConfig cfg;
  cfg.dataset = DatasetKind::kFashionMnist;
  cfg.train_limit = 200;
  const ImageDataset train = load_dataset(cfg, true, 0);
  EXPECT_EQ(train.size, 200);
  EXPECT_EQ(train.channels, 1);
  EXPECT_EQ(train.height, 28);
  EXPECT_EQ(train.num_classes, 10);
  // The first training label of Fashion-MNIST is 9 (ankle boot), the second 0 (T-shirt).
  EXPECT_EQ(train.labels[0], 9);
  EXPECT_EQ(train.labels[1], 0);
}

}  // namespace
}  // namespace partrain::data
