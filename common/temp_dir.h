// defines: TempDir — a directory of its own under the system temp directory (or a given
// parent), readable by its owner only, removed with everything in it when the object goes.
#pragma once

#include <filesystem>
#include <string>

namespace partrain {

class TempDir {
 public:
  // `stem` starts the name ("partrain-run" -> /tmp/partrain-run-3f9a...). Throws Error
  // when no directory can be made.
  explicit TempDir(const std::string& stem,
                   const std::filesystem::path& parent = std::filesystem::temp_directory_path());
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace partrain
