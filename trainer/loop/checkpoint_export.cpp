#include "trainer/loop/checkpoint_export.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/byte_codec.h"
#include "common/errors.h"
#include "trainer/loop/checkpoint_format.h"
#include "trainer/loop/pickle_file.h"
#include "trainer/optim/optimizer_state.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

const char* safetensors_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "F32";
    case at::kDouble:
      return "F64";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      throw UsageError(std::string("export: no safetensors dtype for ") + c10::toString(type));
  }
}

void write_safetensors(const std::string& path, const c10::impl::GenericDict& model) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<at::Tensor> tensors;
  std::uint64_t offset = 0;
  for (const auto& item : model) {
    const at::Tensor t = item.value().toTensor().contiguous().cpu();
    const std::uint64_t bytes = t.nbytes();
    header[item.key().toStringRef()] = {{"dtype", safetensors_dtype(t.scalar_type())},
                                        {"shape", t.sizes().vec()},
                                        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    tensors.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the tensors start 8-aligned
  std::string bytes(8, '\0');
  put_le<std::uint64_t>(bytes.data(), text.size());
  bytes += text;
  bytes.reserve(bytes.size() + offset);
  for (const at::Tensor& t : tensors) {
    bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  write_file_atomically(path, bytes);
}

ExportSummary export_read(const std::string& path, const std::string& out,
                          const std::string& safetensors) {
  ExportSummary summary;
  const c10::IValue loaded = load_pickle(read_file_bytes(path, kMaxCheckpointBytes), path);
  check_checkpoint(loaded, path, /*exporting=*/true);
  const auto top = loaded.toGenericDict();
  const auto model = top.at("model").toGenericDict();
  summary.tensors = model.size();

  // The optimizer's state, whole per parameter, from the shards wherever the run was sharded.
  const c10::IValue& optimizer = top.at("optimizer");
  PARTRAIN_CHECK(optimizer.isGenericDict() && optimizer.toGenericDict().contains("name"),
                 UsageError, "checkpoint ", path, ": its optimizer state is not readable");
  const auto entry = optimizer.toGenericDict();
  const int shards = SavedOptimizerState::shards_of(optimizer, path);
  const std::string dir = fs::path(path).parent_path().string();
  const std::string file = fs::path(path).filename().string();
  const SavedOptimizerState saved(
      optimizer, shards,
      [&](int shard) {
        const std::string shard_path =
            (fs::path(dir) / shard_file_name(file, shard, shards)).string();
        return load_pickle(read_file_bytes(shard_path, kMaxCheckpointBytes), shard_path);
      },
      path);
  StateAssembly assembly(path);
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  for (const auto& item : model) {
    const at::Tensor t = item.value().toTensor();
    const std::size_t d = assembly.add_destination(t.numel(), t.options());
    assembly.add_region(item.key().toStringRef(), d, 0, 0, t.numel());
    parameters.emplace_back(item.key().toStringRef(), t);
  }
  saved.for_each_piece([&](const StatePiece& piece) { assembly.take(piece); });
  c10::impl::GenericDict per_parameter = new_dict();
  for (std::size_t d = 0; d < parameters.size(); ++d) {
    const ParamState state = assembly.result(d);
    if (state.tensors.empty()) continue;
    c10::impl::GenericDict e = new_dict();
    if (state.step) e.insert("step", *state.step);
    for (const auto& [key, t] : state.tensors) e.insert(key, t.view(parameters[d].second.sizes()));
    per_parameter.insert(parameters[d].first, e);
  }
  summary.optimizer_entries = per_parameter.size();
  summary.shards = shards;

  c10::impl::GenericDict consolidated = new_dict();
  for (const auto& item : top) {
    const std::string& key = item.key().toStringRef();
    if (key != "optimizer") {
      consolidated.insert(key, item.value());
      continue;
    }
    c10::impl::GenericDict whole = new_dict();
    whole.insert("name", entry.at("name"));
    whole.insert("state", per_parameter);
    consolidated.insert("optimizer", whole);
  }
  summary.bytes = write_pickle_atomically(out, consolidated);
  if (!safetensors.empty()) write_safetensors(safetensors, model);
  return summary;
}

}  // namespace

ExportSummary export_checkpoint(const std::string& path, const std::string& out,
                                const std::string& safetensors) {
  ExportSummary summary;
  reading_checkpoint(path, [&] { summary = export_read(path, out, safetensors); });
  return summary;
}

}  // namespace partrain
