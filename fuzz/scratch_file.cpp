#include "fuzz/scratch_file.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "common/temp_dir.h"

namespace partrain::fuzz {

namespace {

// Made on first use, removed with its files when the process ends normally.
const std::filesystem::path& scratch_dir() {
  static const TempDir dir("partrain-fuzz");
  return dir.path();
}

}  // namespace

std::string write_scratch_file(const std::string& name, const std::uint8_t* data,
                               std::size_t size) {
  const std::filesystem::path full = scratch_dir() / name;
  std::filesystem::create_directories(full.parent_path());
  const std::string path = full.string();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) throw std::runtime_error("cannot write scratch file " + path);
  const bool written = size == 0 || std::fwrite(data, 1, size, file) == size;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) throw std::runtime_error("cannot write scratch file " + path);
  return path;
}

}  // namespace partrain::fuzz
