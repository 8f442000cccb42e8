#include "common/atomic_file.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <system_error>

#if defined(_WIN32)
#include <fcntl.h>
#include <io.h>
#include <process.h>
#else
#include <fcntl.h>
#include <unistd.h>
#endif

#include "common/errors.h"
#include "common/process_state.h"

namespace partrain {
namespace {

void remove_quietly(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = std::random_device{}();
  const std::uint64_t tag = salt ^ (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  return detail::concat(path, ".tmp-", current_process_id(), "-", std::hex, tag & 0xFFFFFFFFull);
}

void sync_file(const std::string& path) {
#if defined(_WIN32)
  const int fd = _open(path.c_str(), _O_RDWR | _O_BINARY);
  const bool ok = fd >= 0 && _commit(fd) == 0;
  if (fd >= 0) _close(fd);
#else
  const int fd = ::open(path.c_str(), O_RDONLY);
  const bool ok = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
#endif
  PARTRAIN_CHECK(ok, UsageError, "cannot sync ", path, " to disk");
}

void sync_directory(const std::string& dir) {
#if !defined(_WIN32)
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  const bool ok = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  PARTRAIN_CHECK(ok, UsageError, "cannot sync the directory ", dir, " to disk");
#else
  (void)dir;
#endif
}

void commit_file(const std::string& temp_path, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(temp_path, path, ec);
  if (ec) {
    remove_quietly(temp_path);
    throw UsageError(detail::concat("cannot move ", temp_path, " to ", path, ": ", ec.message()));
  }
  sync_directory(std::filesystem::path(path).parent_path().string());
}

std::string write_temp_file(const std::string& path, std::string_view bytes) {
  const std::string temp = temp_path_for(path);
  std::FILE* out = std::fopen(temp.c_str(), "wb");
  PARTRAIN_CHECK(out != nullptr, UsageError, path, ": cannot write (", temp, " did not open)");
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size();
  const bool closed = std::fclose(out) == 0;
  if (!written || !closed) {
    remove_quietly(temp);
    throw UsageError(detail::concat(path, ": write failed (disk full?)"));
  }
  try {
    sync_file(temp);
  } catch (const Error&) {
    remove_quietly(temp);
    throw;
  }
  return temp;
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  commit_file(write_temp_file(path, bytes), path);
}

}  // namespace partrain
