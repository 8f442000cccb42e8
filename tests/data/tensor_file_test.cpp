// tensors: files written by Python's torch.save (Debian's python3-torch) read back exactly,
// and every malformed one refused with one line naming the file.
#include "trainer/data/tensor_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/data/scratch_files.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"
#include "trainer/data/unpickled.h"

namespace partrain::data {
namespace {

namespace fs = std::filesystem;
using test_files::usage_error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;

// One Python run writes every file the tests read (importing torch takes seconds).
constexpr const char* kWriter = R"(
import sys, torch
d = sys.argv[1]
n, c, h, w = 6, 3, 4, 5
images = (torch.arange(n * c * h * w) % 251).to(torch.uint8).reshape(n, c, h, w)
labels = torch.tensor([0, 1, 2, 1, 0, 2], dtype=torch.int64)
torch.save({"images": images, "labels": labels}, d + "/good/train.pt")
torch.save({"images": images[:2].clone(), "labels": labels[:2].clone()}, d + "/good/test.pt")
torch.save({"images": images, "labels": labels, "classes": ["a", "b", "c", "d"]}, d + "/classes.pt")
# A view of a larger tensor: the reader must honour strides, not assume a fresh storage.
torch.save({"images": images.permute(0, 1, 3, 2), "labels": labels}, d + "/strided.pt")
torch.save({"images": images.float(), "labels": labels}, d + "/float_images.pt")
torch.save({"images": images, "labels": labels.int()}, d + "/int32_labels.pt")
torch.save({"images": images, "labels": labels[:5]}, d + "/short_labels.pt")
torch.save({"images": images[0], "labels": labels}, d + "/three_dims.pt")
torch.save([images, labels], d + "/list.pt")
torch.save({"images": images, "targets": labels}, d + "/no_labels.pt")
torch.save({"images": images, "labels": torch.tensor([0, 1, 2, 1, 0, 4])}, d + "/label_4_of_4.pt")
torch.save({"images": images, "labels": torch.tensor([0, 1, 9, 1, 0, 2]), "classes": ["a", "b", "c"]}, d + "/outside_classes.pt")
torch.save({"images": images, "labels": torch.tensor([0, -1, 2, 1, 0, 2])}, d + "/negative.pt")
# One byte of storage seen as 200 million images (12 GB once copied): refused before any copy.
one = torch.zeros(1, dtype=torch.uint8)
torch.save({"images": one.expand(200000000, 3, 4, 5), "labels": torch.zeros(1, dtype=torch.int64).expand(200000000)}, d + "/expanded.pt")
# The file's sizes say 60 images where its storage holds 6 (torch.save never writes that: the
# pickle's size tuple changed in the archive, which Python's torch.load refuses too).
import zipfile
src = zipfile.ZipFile(d + "/good/train.pt")
out = zipfile.ZipFile(d + "/outrun.pt", "w", zipfile.ZIP_STORED)
for info in src.infolist():
    data = src.read(info.filename)
    if info.filename.endswith("data.pkl"):
        data = data.replace(b"K\x06K\x03K\x04K\x05", b"K\x3cK\x03K\x04K\x05")
    out.writestr(info, data)
out.close()
)";

class TensorFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    fs::create_directories(*dir_ / "good");
    std::ofstream(*dir_ / "writer.py") << kWriter;
    const std::string command = "timeout 300 /usr/bin/python3 " + (*dir_ / "writer.py") + " " +
                                dir_->string() + " > " + (*dir_ / "writer.log") + " 2>&1";
    python_ok_ =
        std::system("timeout 120 /usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0;
    if (python_ok_) {
      const int rc = std::system(command.c_str());
      ASSERT_EQ(rc, 0) << "the writer failed; see " << (*dir_ / "writer.log");
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!python_ok_) GTEST_SKIP() << "/usr/bin/python3 with torch (python3-torch) is missing";
  }
  static std::string path(const std::string& name) { return *dir_ / name; }

  static ScratchDir* dir_;
  static bool python_ok_;
};
ScratchDir* TensorFile::dir_ = nullptr;
bool TensorFile::python_ok_ = false;

TEST_F(TensorFile, ReadsWhatTorchSaveWrote) {
  const ImageDataset d = read_tensor_file(path("good/train.pt"), 0);
  EXPECT_EQ(d.name, "tensors");
  EXPECT_EQ(d.size, 6);
  EXPECT_EQ(d.channels, 3);
  EXPECT_EQ(d.height, 4);
  EXPECT_EQ(d.width, 5);
  EXPECT_EQ(d.num_classes, 3);  // largest label + 1
  EXPECT_EQ(d.labels, (std::vector<std::int64_t>{0, 1, 2, 1, 0, 2}));
  ASSERT_EQ(d.pixels.size(), 6u * 60);
  for (std::size_t i = 0; i < d.pixels.size(); ++i) ASSERT_EQ(d.pixels[i], i % 251) << i;
  EXPECT_EQ(read_tensor_file(path("classes.pt"), 0).num_classes, 4);
  EXPECT_EQ(read_tensor_file(path("good/train.pt"), 4).size, 4);

  // Transposed H and W: sample 0, channel 0, row 1, column 0 is the original (0, 0, 0, 1).
  const ImageDataset t = read_tensor_file(path("strided.pt"), 0);
  EXPECT_EQ(t.height, 5);
  EXPECT_EQ(t.width, 4);
  EXPECT_EQ(t.image(0)[1 * 4 + 0], 1);
  EXPECT_EQ(t.image(0)[0 * 4 + 1], 5);
}

TEST_F(TensorFile, LoadSplitsComputesStatisticsAndChecksTheTestSplit) {
  DataConfig cfg;
  cfg.dataset = DatasetKind::kTensors;
  cfg.root = path("good");
  const DatasetSplits splits = load_splits(cfg, 0, &read_tensor_file);
  EXPECT_EQ(splits.train.size, 6);
  EXPECT_EQ(splits.test.size, 2);
  EXPECT_EQ(splits.test.num_classes, 3);
  std::vector<float> mean, std;
  compute_channel_stats(splits.train, mean, std);
  EXPECT_EQ(splits.train.mean, mean);
  EXPECT_EQ(splits.test.std, std);
  EXPECT_EQ(load_dataset(cfg, false, 0, &read_tensor_file).mean, mean);
  EXPECT_THAT(usage_error_of([&] { load_splits(cfg, 0); }),
              HasSubstr("data.dataset tensors needs LibTorch's reader"));

  // A test split whose labels go beyond the training split's classes, or of another shape.
  fs::copy_file(path("negative.pt"), path("good/test.pt"), fs::copy_options::overwrite_existing);
  EXPECT_THAT(usage_error_of([&] { load_splits(cfg, 0, &read_tensor_file); }),
              HasSubstr("test.pt: \"labels\"[1] is -1"));
  fs::copy_file(path("label_4_of_4.pt"), path("good/test.pt"),
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(usage_error_of([&] { load_splits(cfg, 0, &read_tensor_file); }),
              HasSubstr("test.pt: \"labels\"[5] is 4, outside the training split's 3 classes"));
  fs::copy_file(path("strided.pt"), path("good/test.pt"), fs::copy_options::overwrite_existing);
  EXPECT_THAT(usage_error_of([&] { load_splits(cfg, 0, &read_tensor_file); }),
              HasSubstr("test.pt: images are 3x5x4 but the training split's are 3x4x5"));
  cfg.root = path("nowhere");
  EXPECT_THAT(usage_error_of([&] { load_splits(cfg, 0, &read_tensor_file); }),
              HasSubstr("nowhere/train.pt: no such file"));
}

TEST_F(TensorFile, MalformedFilesAreNamed) {
  auto error = [](const std::string& name) {
    const std::string message = usage_error_of([&] { read_tensor_file(path(name), 0); });
    EXPECT_THAT(message, AllOf(HasSubstr(path(name) + ": "), ::testing::Not(HasSubstr("\n"))));
    return message;
  };
  EXPECT_THAT(error("float_images.pt"), HasSubstr("\"images\" is Float, not uint8"));
  EXPECT_THAT(error("int32_labels.pt"), HasSubstr("\"labels\" is Int, not int64"));
  EXPECT_THAT(error("short_labels.pt"), HasSubstr("\"labels\" holds 5 labels but \"images\" 6"));
  EXPECT_THAT(error("three_dims.pt"),
              HasSubstr("\"images\" has shape [3, 4, 5], not [N, C, H, W]"));
  EXPECT_THAT(error("list.pt"), HasSubstr("not a dict with \"images\" and \"labels\""));
  EXPECT_THAT(error("no_labels.pt"), HasSubstr("the dict has no \"labels\""));
  EXPECT_THAT(error("outside_classes.pt"),
              HasSubstr("\"labels\"[2] is 9, outside the 3 classes \"classes\" names"));
  EXPECT_THAT(error("negative.pt"), HasSubstr("\"labels\"[1] is -1"));
  EXPECT_THAT(error("expanded.pt"), HasSubstr("200000000 images of 60 bytes exceed the "
                                              "4294967296 bytes held in memory"));
  EXPECT_THAT(error("outrun.pt"), HasSubstr("\"images\" of shape [60, 3, 4, 5] reaches past "
                                            "the data the file holds for it"));

  // Cut in half, and bytes that were never a torch.save file.
  const std::vector<std::uint8_t> whole = test_files::read_bytes(path("good/train.pt"));
  test_files::write_bytes(path("cut.pt"), {whole.begin(), whole.begin() + whole.size() / 2});
  EXPECT_THAT(error("cut.pt"), HasSubstr("not a file torch.save wrote, or truncated"));
  test_files::write_bytes(path("text.pt"), {'h', 'e', 'l', 'l', 'o'});
  EXPECT_THAT(error("text.pt"), HasSubstr("not a file torch.save wrote, or truncated"));
}

// A tensor whose sizes reach past its storage is found wherever a checkpoint's value holds it,
// and named by its keys; views inside their storage (offsets, strides of 0) pass; a value the
// pickle's memo shares is looked into once (64 levels of a list holding the one below twice
// would be 2^64 visits otherwise).
TEST(Unpickled, ATensorPastItsStorageIsFoundWhereverItLies) {
  const at::Tensor good = at::arange(12, at::kFloat);
  at::Tensor outrun = at::zeros({4}, at::kFloat);
  outrun.unsafeGetTensorImpl()->set_sizes_contiguous({100});  // as a rewritten data.pkl says
  EXPECT_TRUE(within_storage(good.slice(0, 4).view({2, 4})));
  EXPECT_TRUE(within_storage(good.slice(0, 11, 12).expand({1000})));
  EXPECT_TRUE(within_storage(at::zeros({0, 5})));
  EXPECT_FALSE(within_storage(outrun));

  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  model.insert("fc.weight", good);
  model.insert("fc.bias", outrun);
  c10::impl::GenericList state(c10::AnyType::get());
  state.push_back(c10::ivalue::Tuple::create({c10::IValue(std::int64_t{3}), c10::IValue(good)}));
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("optimizer", state);
  EXPECT_EQ(tensor_past_storage(top), "");
  top.insert("model", model);
  EXPECT_EQ(tensor_past_storage(top), "model/fc.bias of shape [100]");
  state.push_back(c10::ivalue::Tuple::create({c10::IValue(std::int64_t{4}), c10::IValue(outrun)}));
  EXPECT_EQ(model.erase("fc.bias"), 1u);
  EXPECT_EQ(tensor_past_storage(top), "optimizer/1/1 of shape [100]");
  EXPECT_EQ(tensor_past_storage(c10::IValue(outrun)), "a tensor of shape [100]");

  c10::IValue shared(good);
  for (int level = 0; level < 64; ++level) {
    c10::impl::GenericList twice(c10::AnyType::get());
    twice.push_back(shared);
    twice.push_back(shared);
    shared = twice;
  }
  EXPECT_EQ(tensor_past_storage(shared), "");
}

}  // namespace
}  // namespace partrain::data
