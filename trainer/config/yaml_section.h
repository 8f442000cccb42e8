// defines: Section, Origins, load_yaml_document(), invalid_utf8_at() — the YAML reading under
// load_config(): every key is read through a Section, which knows the key's path and the
// place it came from (FILE:LINE:COL, or the --set override that wrote it), so that every
// error names both. Keys a Section was never asked for are reported as unknown.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "trainer/config/config_enums.h"

namespace partrain {

// Where each override came from, by the key path it set, so errors can point at it.
struct Origins {
  std::string file;
  std::map<std::string, std::string> overrides;  // "data.batch_size" -> "--set data.batch_size=0"

  std::string where(const std::string& path, const YAML::Mark& mark) const;
};

// Throws UsageError "WHERE: PATH: WHAT", WHERE being FILE:LINE:COL or the override.
[[noreturn]] void fail(const Origins& origins, const std::string& path, const YAML::Mark& mark,
                       const std::string& what);

// Where `text` stops being UTF-8 (a byte index), or npos when all of it is. JSON (report.json)
// and YAML both require UTF-8, so a string that is not cannot be carried through.
std::size_t invalid_utf8_at(const std::string& text);

// The file at `path` as a YAML mapping, with each "a.b.c=value" override applied in order (the
// value parsed as YAML, so 3, true, [1,2] and "text" keep their types); `origins` learns
// where each key came from. Throws UsageError for a file that cannot be read, is not YAML, or
// is not a mapping, and for a malformed override.
YAML::Node load_yaml_document(const std::string& path, const std::vector<std::string>& overrides,
                              Origins& origins);

class Section {
 public:
  // Throws UsageError when `node` is neither absent nor a mapping, or repeats a key.
  Section(YAML::Node node, std::string path, const Origins& origins);

  Section section(const std::string& key) { return Section(child(key), full(key), origins_); }

  // Each reader leaves `out` as it is when the key is absent (or null), and throws UsageError
  // naming the key and its place when the value has the wrong type or is out of range.
  void read(const std::string& key, std::string& out,
            std::initializer_list<const char*> allowed = {});
  void read(const std::string& key, std::string& out, const std::vector<std::string>& allowed);
  // The text of a key that must be a UTF-8 string; nullopt when it is absent (or null).
  std::optional<std::string> read_text(const std::string& key);
  // A string that `problem` accepts: it returns what is wrong with a value, or "".
  void read_checked(const std::string& key, std::string& out,
                    const std::function<std::string(const std::string&)>& problem);
  // One of the names of Enum's table (config_enums.h), in the table's order in the error.
  template <typename Enum>
  void read_enum(const std::string& key, Enum& out);
  template <typename Int>
  void read_int(const std::string& key, Int& out, long long min, long long max) {
    if (const std::optional<long long> value = read_integer(key, min, max)) {
      out = static_cast<Int>(*value);
    }
  }
  void read_double(const std::string& key, double& out, double min, double max);
  void read_bool(const std::string& key, bool& out);
  // A list of finite numbers, each in [min, max]; a single number is a list of one. Returns
  // the node (null when absent) so that callers can point at it.
  YAML::Node read_double_list(const std::string& key, std::vector<double>& out, double min,
                              double max, std::size_t max_count);

  // The node itself, for keys that accept more than one shape.
  YAML::Node raw(const std::string& key) { return child(key); }
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const Origins& origins() const { return origins_; }

  // Reports the first key that no reader asked for.
  void finish() const;

 private:
  YAML::Node child(const std::string& key);
  static bool present(const YAML::Node& n) { return n.IsDefined() && !n.IsNull(); }
  std::optional<long long> read_integer(const std::string& key, long long min, long long max);
  void check_range(const std::string& key, const YAML::Node& n, double value, double min,
                   double max);

  YAML::Node node_;
  std::string path_;
  const Origins& origins_;
  std::set<std::string> asked_;
};

template <typename Enum>
void Section::read_enum(const std::string& key, Enum& out) {
  const std::optional<std::string> text = read_text(key);
  if (!text) return;
  std::string list;
  for (const EnumName<Enum>& entry : names_of(out)) {
    if (entry.name == *text) {
      out = entry.value;
      return;
    }
    list += (list.empty() ? "" : " | ") + std::string(entry.name);
  }
  fail(origins_, full(key), child(key).Mark(), "'" + *text + "' is not one of " + list);
}

}  // namespace partrain
