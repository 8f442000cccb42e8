// defines: FileStore — a Store kept in a directory, one file per key.
//
// Writers publish a key by writing a temp file and renaming it into place, so a reader sees
// a whole value or none. add() takes a lock directory (mkdir is atomic on every filesystem
// we target) around read-modify-write. A non-empty run token gives the run its own
// subdirectory; with world_size > 1 the ranks also agree on a session folder inside it (Note
// [File store sessions] in file_store.cpp), so a directory reused by a later run, even one
// with the same token, never shows it the keys or locks of an earlier one.
#pragma once

#include <cstdint>
#include <filesystem>

#include "comm_backends/store/store.h"

namespace partrain::comm {

class FileStore : public Store {
 public:
  FileStore(const std::filesystem::path& directory, const StoreOptions& options);

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  const std::filesystem::path& directory() const { return directory_; }

 private:
  void open_session(int rank, int world_size);
  static void remove_stale_entries(const std::filesystem::path& base);
  std::filesystem::path key_path(const std::string& key) const;
  bool try_read(const std::string& key, std::vector<std::uint8_t>& value) const;
  void write_atomically(const std::filesystem::path& path,
                        const std::vector<std::uint8_t>& value) const;

  std::filesystem::path directory_;
  std::chrono::milliseconds timeout_;
};

}  // namespace partrain::comm
