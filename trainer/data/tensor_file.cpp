#include "trainer/data/tensor_file.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "trainer/data/unpickled.h"

namespace partrain::data {

namespace {

// The unpickler holds the whole file and then the tensors it makes; beyond the pixel limit
// itself a file may carry labels (8 bytes a sample) and zip overhead.
constexpr std::uintmax_t kMaxFileBytes = kMaxDatasetBytes + (1ull << 30);

}  // namespace

ImageDataset read_tensor_file(const std::string& path, std::int64_t limit) {
  std::error_code ec;
  PARTRAIN_CHECK(std::filesystem::is_regular_file(path, ec), UsageError, path,
                 ": no such file (tensors expects DIR/train.pt and DIR/test.pt, written by "
                 "torch.save({\"images\": ..., \"labels\": ...}, path))");
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, path, ": cannot read its size: ", ec.message());
  PARTRAIN_CHECK(bytes <= kMaxFileBytes, UsageError, path, ": ", bytes, " bytes, more than the ",
                 kMaxFileBytes, " a tensors file may have");
  std::vector<char> data(static_cast<std::size_t>(bytes));
  {
    std::ifstream in(path, std::ios::binary);
    PARTRAIN_CHECK(in, UsageError, path, ": cannot open for reading");
    in.read(data.data(), static_cast<std::streamsize>(data.size()));
    PARTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(data.size()), UsageError, path,
                   ": read failed at byte ", in.gcount(), " of ", bytes);
  }

  c10::IValue loaded;
  try {
    loaded = torch::jit::pickle_load(data);
  } catch (const c10::Error& e) {
    throw UsageError(detail::concat(path, ": not a file torch.save wrote, or truncated (",
                                    first_line(e.what_without_backtrace()), ")"));
  } catch (const std::exception& e) {
    throw UsageError(detail::concat(path, ": not a file torch.save wrote, or truncated (",
                                    first_line(e.what()), ")"));
  }
  std::vector<char>().swap(data);
  PARTRAIN_CHECK(loaded.isGenericDict(), UsageError, path, ": holds a ", loaded.tagKind(),
                 ", not a dict with \"images\" and \"labels\"");
  const c10::Dict<c10::IValue, c10::IValue> dict = loaded.toGenericDict();
  auto tensor_at = [&](const char* key) {
    PARTRAIN_CHECK(dict.contains(key), UsageError, path, ": the dict has no \"", key, "\"");
    const c10::IValue& value = dict.at(key);
    PARTRAIN_CHECK(value.isTensor(), UsageError, path, ": \"", key, "\" is a ", value.tagKind(),
                   ", not a tensor");
    return value.toTensor();
  };
  at::Tensor images = tensor_at("images");
  at::Tensor labels = tensor_at("labels");
  for (const auto& [key, t] : {std::pair{"images", images}, std::pair{"labels", labels}}) {
    PARTRAIN_CHECK(within_storage(t), UsageError, path, ": \"", key, "\" of shape ", shape_text(t),
                   " reaches past the data the file holds for it (a damaged file)");
  }

  PARTRAIN_CHECK(images.scalar_type() == at::kByte, UsageError, path, ": \"images\" is ",
                 images.scalar_type(), ", not uint8 (save images.to(torch.uint8), 0..255)");
  PARTRAIN_CHECK(images.dim() == 4, UsageError, path, ": \"images\" has shape ", shape_text(images),
                 ", not [N, C, H, W]");
  PARTRAIN_CHECK(labels.scalar_type() == at::kLong, UsageError, path, ": \"labels\" is ",
                 labels.scalar_type(), ", not int64 (save labels.to(torch.int64))");
  PARTRAIN_CHECK(labels.dim() == 1, UsageError, path, ": \"labels\" has shape ", shape_text(labels),
                 ", not [N]");
  const std::int64_t n = images.size(0);
  PARTRAIN_CHECK(labels.size(0) == n, UsageError, path, ": \"labels\" holds ", labels.size(0),
                 " labels but \"images\" ", n, " images");
  PARTRAIN_CHECK(n > 0, UsageError, path, ": no samples (N = 0)");
  PARTRAIN_CHECK(images.size(1) >= 1 && images.size(1) <= 64 && images.size(2) >= 1 &&
                     images.size(2) <= 4096 && images.size(3) >= 1 && images.size(3) <= 4096,
                 UsageError, path, ": \"images\" has shape ", shape_text(images),
                 "; C must be 1..64 and H, W 1..4096");

  int num_classes = 0;
  if (dict.contains("classes")) {
    const c10::IValue& classes = dict.at("classes");
    PARTRAIN_CHECK(classes.isList() || classes.isTuple(), UsageError, path, ": \"classes\" is a ",
                   classes.tagKind(), ", not a list of class names");
    const std::size_t count =
        classes.isList() ? classes.toListRef().size() : classes.toTupleRef().elements().size();
    PARTRAIN_CHECK(count >= 1 && count <= (1u << 20), UsageError, path, ": \"classes\" lists ",
                   count, " names; 1 .. 1048576 expected");
    num_classes = static_cast<int>(count);
  }

  const std::int64_t keep = limit > 0 ? std::min(n, limit) : n;
  ImageDataset out;
  out.name = "tensors";
  out.size = keep;
  out.channels = static_cast<int>(images.size(1));
  out.height = static_cast<int>(images.size(2));
  out.width = static_cast<int>(images.size(3));
  // Checked before the copy below: a stride-0 tensor holds N images in a file of one.
  const auto sample_bytes = static_cast<std::uint64_t>(out.sample_bytes());
  PARTRAIN_CHECK(static_cast<std::uint64_t>(keep) <= kMaxDatasetBytes / sample_bytes, UsageError,
                 path, ": ", keep, " images of ", sample_bytes, " bytes exceed the ",
                 kMaxDatasetBytes, " bytes held in memory; set data.train_limit / data.test_limit");
  images = images.slice(0, 0, keep).contiguous();
  labels = labels.slice(0, 0, keep).contiguous();
  const std::uint64_t pixel_bytes = static_cast<std::uint64_t>(keep) * sample_bytes;
  const std::uint8_t* pixels = images.data_ptr<std::uint8_t>();
  out.pixels.assign(pixels, pixels + pixel_bytes);
  const std::int64_t* label = labels.data_ptr<std::int64_t>();
  out.labels.assign(label, label + keep);
  std::int64_t largest = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    PARTRAIN_CHECK(label[i] >= 0, UsageError, path, ": \"labels\"[", i, "] is ", label[i],
                   "; labels are class indices from 0");
    PARTRAIN_CHECK(num_classes == 0 || label[i] < num_classes, UsageError, path, ": \"labels\"[", i,
                   "] is ", label[i], ", outside the ", num_classes,
                   " classes \"classes\" names (0..", num_classes - 1, ")");
    PARTRAIN_CHECK(label[i] < (1 << 20), UsageError, path, ": \"labels\"[", i, "] is ", label[i],
                   "; more than 1048576 classes");
    largest = std::max(largest, label[i]);
  }
  out.num_classes = num_classes > 0 ? num_classes : static_cast<int>(largest + 1);
  return out;
}

}  // namespace partrain::data
