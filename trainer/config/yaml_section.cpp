#include "trainer/config/yaml_section.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace partrain {

std::string Origins::where(const std::string& path, const YAML::Mark& mark) const {
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    const std::string& key = it->first;
    if (path == key || path.rfind(key + ".", 0) == 0) return it->second;
  }
  if (mark.is_null()) return file;
  return detail::concat(file, ":", mark.line + 1, ":", mark.column + 1);
}

void fail(const Origins& origins, const std::string& path, const YAML::Mark& mark,
          const std::string& what) {
  throw UsageError(detail::concat(origins.where(path, mark), ": ", path, ": ", what));
}

std::size_t invalid_utf8_at(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t extra = 0;
    unsigned min = 0;
    unsigned code = lead;
    if (lead < 0x80)
      extra = 0;
    else if ((lead & 0xe0) == 0xc0)
      extra = 1, min = 0x80, code = lead & 0x1f;
    else if ((lead & 0xf0) == 0xe0)
      extra = 2, min = 0x800, code = lead & 0x0f;
    else if ((lead & 0xf8) == 0xf0)
      extra = 3, min = 0x10000, code = lead & 0x07;
    else
      return i;
    if (i + extra >= text.size() && extra > 0) return i;  // cut off at the end
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return i;
      code = (code << 6) | (next & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either.
    if (code < min || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return i;
    i += extra + 1;
  }
  return std::string::npos;
}

namespace {

// Applies "a.b.c=value" to the document; the value is parsed as YAML (so 3, true, [1,2]
// and "text" keep their types).
void apply_override(YAML::Node& root, const std::string& assignment, Origins& origins) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw UsageError("--set " + assignment + ": expected key.path=value");
  }
  std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw UsageError("--set " + assignment + ": value is not valid YAML: " + e.msg);
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) throw UsageError("--set " + assignment + ": empty key in '" + path + "'");
    parts.push_back(part);
  }
  YAML::Node cur = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[parts[i]];
    } else if (!next.IsMap()) {
      throw UsageError("--set " + assignment + ": '" + parts[i] + "' is not a section");
    }
    cur.reset(next);
  }
  cur[parts.back()] = parsed;
  origins.overrides[path] = "--set " + assignment;
}

}  // namespace

YAML::Node load_yaml_document(const std::string& path, const std::vector<std::string>& overrides,
                              Origins& origins) {
  origins.file = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot open config file");
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    throw UsageError(detail::concat(path, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                    ": not valid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw UsageError(detail::concat(path, ":", root.Mark().line + 1, ":", root.Mark().column + 1,
                                    ": expected a mapping of config keys at the top level"));
  }
  for (const auto& o : overrides) apply_override(root, o, origins);
  return root;
}

Section::Section(YAML::Node node, std::string path, const Origins& origins)
    : node_(std::move(node)), path_(std::move(path)), origins_(origins) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    fail(origins_, path_.empty() ? "(top level)" : path_, node_.Mark(),
         "expected a mapping of keys");
  }
  // yaml-cpp keeps the first of two equal keys and drops the second without a word; a
  // config that says a thing twice is ambiguous, so it is an error here.
  if (node_.IsDefined() && node_.IsMap()) {
    std::map<std::string, YAML::Mark> first_seen;
    for (const auto& kv : node_) {
      auto [it, inserted] = first_seen.emplace(kv.first.Scalar(), kv.first.Mark());
      if (!inserted) {
        fail(origins_, full(kv.first.Scalar()), kv.first.Mark(),
             detail::concat("duplicate key (first set at line ", it->second.line + 1, ")"));
      }
    }
  }
}

std::optional<std::string> Section::read_text(const std::string& key) {
  YAML::Node n = child(key);
  if (!present(n)) return std::nullopt;
  if (!n.IsScalar()) fail(origins_, full(key), n.Mark(), "expected a string");
  std::string value = n.Scalar();
  if (const auto bad = invalid_utf8_at(value); bad != std::string::npos) {
    fail(origins_, full(key), n.Mark(),
         detail::concat("not UTF-8 text (byte ", bad, " of the value)"));
  }
  return value;
}

void Section::read(const std::string& key, std::string& out,
                   std::initializer_list<const char*> allowed) {
  read(key, out, std::vector<std::string>(allowed.begin(), allowed.end()));
}

void Section::read(const std::string& key, std::string& out,
                   const std::vector<std::string>& allowed) {
  std::optional<std::string> value = read_text(key);
  if (!value) return;
  if (allowed.size() > 0) {
    bool ok = false;
    std::string list;
    for (const std::string& a : allowed) {
      ok = ok || *value == a;
      list += list.empty() ? a : std::string(" | ") + a;
    }
    if (!ok) fail(origins_, full(key), child(key).Mark(), "'" + *value + "' is not one of " + list);
  }
  out = *value;
}

void Section::read_checked(const std::string& key, std::string& out,
                           const std::function<std::string(const std::string&)>& problem) {
  std::string value;
  read(key, value);
  if (value.empty()) return;
  if (const std::string what = problem(value); !what.empty()) {
    fail(origins_, full(key), child(key).Mark(), what);
  }
  out = value;
}

std::optional<long long> Section::read_integer(const std::string& key, long long min,
                                               long long max) {
  YAML::Node n = child(key);
  if (!present(n)) return std::nullopt;
  long long value = 0;
  if (!n.IsScalar() || !YAML::convert<long long>::decode(n, value)) {
    fail(origins_, full(key), n.Mark(),
         "expected an integer, got '" + (n.IsScalar() ? n.Scalar() : std::string("a collection")) +
             "'");
  }
  check_range(key, n, static_cast<double>(value), static_cast<double>(min),
              static_cast<double>(max));
  return value;
}

void Section::read_double(const std::string& key, double& out, double min, double max) {
  YAML::Node n = child(key);
  if (!present(n)) return;
  double value = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, value) || !std::isfinite(value)) {
    fail(origins_, full(key), n.Mark(),
         "expected a number, got '" + (n.IsScalar() ? n.Scalar() : std::string("a collection")) +
             "'");
  }
  check_range(key, n, value, min, max);
  out = value;
}

void Section::read_bool(const std::string& key, bool& out) {
  YAML::Node n = child(key);
  if (!present(n)) return;
  bool value = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, value)) {
    fail(origins_, full(key), n.Mark(), "expected true or false, got '" + n.Scalar() + "'");
  }
  out = value;
}

YAML::Node Section::read_double_list(const std::string& key, std::vector<double>& out, double min,
                                     double max, std::size_t max_count) {
  YAML::Node n = child(key);
  if (!present(n)) return YAML::Node();
  std::vector<YAML::Node> items;
  if (n.IsScalar()) {
    items.push_back(n);
  } else if (n.IsSequence()) {
    for (const auto& item : n) items.push_back(item);
  } else {
    fail(origins_, full(key), n.Mark(), "expected a number or a list of numbers");
  }
  if (items.empty() || items.size() > max_count) {
    fail(origins_, full(key), n.Mark(),
         detail::concat("expected 1 to ", max_count, " numbers, got ", items.size()));
  }
  std::vector<double> values;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const YAML::Node& item = items[i];
    double value = 0;
    if (!item.IsScalar() || !YAML::convert<double>::decode(item, value) || !std::isfinite(value)) {
      fail(origins_, full(key), item.Mark(),
           detail::concat("item ", i, ": expected a number, got '",
                          item.IsScalar() ? item.Scalar() : std::string("a collection"), "'"));
    }
    if (value < min || value > max) {
      std::ostringstream msg;
      msg << "item " << i << ": " << item.Scalar() << " is out of range " << (min > 0 ? "(" : "[")
          << (min > 0 ? 0.0 : min) << ", " << max << "]";
      fail(origins_, full(key), item.Mark(), msg.str());
    }
    values.push_back(value);
  }
  out = values;
  return n;
}

void Section::finish() const {
  if (!node_.IsDefined() || !node_.IsMap()) return;
  for (const auto& kv : node_) {
    std::string key = kv.first.Scalar();
    if (!asked_.count(key)) {
      std::string known;
      for (const auto& k : asked_) known += (known.empty() ? "" : ", ") + k;
      fail(origins_, full(key), kv.first.Mark(), "unknown key (known here: " + known + ")");
    }
  }
}

YAML::Node Section::child(const std::string& key) {
  asked_.insert(key);
  if (!node_.IsDefined() || node_.IsNull()) return YAML::Node();
  return node_[key];
}

void Section::check_range(const std::string& key, const YAML::Node& n, double value, double min,
                          double max) {
  if (value < min || value > max) {
    auto text = [](double v) {
      std::ostringstream out;
      if (std::abs(v) < 1e15 && v == std::floor(v)) {
        out << static_cast<long long>(v);
      } else {
        out << v;
      }
      return out.str();
    };
    std::ostringstream msg;
    msg << n.Scalar() << " is out of range [" << text(min) << ", " << text(max) << "]";
    fail(origins_, full(key), n.Mark(), msg.str());
  }
}

}  // namespace partrain
