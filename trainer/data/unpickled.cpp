#include "trainer/data/unpickled.h"

#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

namespace partrain::data {

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string shape_text(const at::Tensor& t) {
  std::string out = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    out += (d == 0 ? "" : ", ") + std::to_string(t.size(d));
  }
  return out + "]";
}

bool within_storage(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  if (!t.has_storage() || t.storage_offset() < 0) return false;
  std::uint64_t last = static_cast<std::uint64_t>(t.storage_offset());
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) return false;
    const auto reach = static_cast<std::uint64_t>(t.size(d) - 1);
    const auto stride = static_cast<std::uint64_t>(t.stride(d));
    if (stride != 0 && reach > (~std::uint64_t{0} - last) / stride) return false;
    last += reach * stride;
  }
  return last < t.storage().nbytes() / t.element_size();
}

std::string tensor_past_storage(const c10::IValue& value) {
  // Depth first with a stack of its own: a file nests as deep as it likes.
  std::vector<std::pair<c10::IValue, std::string>> pending{{value, ""}};
  std::unordered_set<const void*> seen;
  auto child = [](const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "/" + key;
  };
  while (!pending.empty()) {
    auto [v, path] = std::move(pending.back());
    pending.pop_back();
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!within_storage(t))
        return (path.empty() ? "a tensor" : path) + " of shape " + shape_text(t);
      continue;
    }
    if (!v.isGenericDict() && !v.isList() && !v.isTuple()) continue;
    if (!seen.insert(v.internalToPointer()).second) continue;
    if (v.isGenericDict()) {
      for (const auto& entry : v.toGenericDict()) {
        const c10::IValue& key = entry.key();
        const std::string name = key.isString() ? key.toStringRef()
                                 : key.isInt()  ? std::to_string(key.toInt())
                                                : std::string("<") + key.tagKind() + " key>";
        pending.emplace_back(key, child(path, name));
        pending.emplace_back(entry.value(), child(path, name));
      }
    } else if (v.isList()) {
      const auto list = v.toListRef();
      for (std::size_t i = 0; i < list.size(); ++i) {
        pending.emplace_back(list[i], child(path, std::to_string(i)));
      }
    } else {
      const auto& items = v.toTupleRef().elements();
      for (std::size_t i = 0; i < items.size(); ++i) {
        pending.emplace_back(items[i], child(path, std::to_string(i)));
      }
    }
  }
  return "";
}

}  // namespace partrain::data
