#include "trainer/data/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "comm_backends/errors.h"
#include "trainer/data/counter_rng.h"

namespace partrain::data {

std::string temp_path_for(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  const auto now =
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const std::uint64_t tag =
      mix_seed(static_cast<std::uint64_t>(::getpid()), now, counter.fetch_add(1));
  return detail::concat(path, ".tmp-", ::getpid(), "-", std::hex, tag & 0xFFFFFFFFull);
}

void commit_file(const std::string& temp_path, const std::string& path) {
  std::error_code ec;
  std::filesystem::rename(temp_path, path, ec);
  if (ec) {
    const std::string reason = ec.message();
    std::filesystem::remove(temp_path, ec);
    throw UsageError(detail::concat("cannot move ", temp_path, " to ", path, ": ", reason));
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string temp = temp_path_for(path);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    PARTRAIN_CHECK(out, UsageError, path, ": cannot write (", temp, " did not open)");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      throw UsageError(detail::concat(path, ": write failed (disk full?)"));
    }
  }
  commit_file(temp, path);
}

}  // namespace partrain::data
