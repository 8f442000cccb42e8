// defines: TarEntry and make_tar_gz() — builds .tar.gz archives in memory (libarchive) for
// the download and extraction tests, including hostile ones (absolute paths, "..", links).
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <cstdint>
#include <string>
#include <vector>

namespace partrain::data::test_files {

struct TarEntry {
  std::string name;
  std::vector<std::uint8_t> bytes;
  bool directory = false;
  std::string symlink_to;  // non-empty: a symbolic link

  static TarEntry file(std::string name, std::vector<std::uint8_t> bytes) {
    return {std::move(name), std::move(bytes), false, ""};
  }
  static TarEntry dir(std::string name) { return {std::move(name), {}, true, ""}; }
  static TarEntry link(std::string name, std::string target) {
    return {std::move(name), {}, false, std::move(target)};
  }
};

inline std::vector<std::uint8_t> make_tar_gz(const std::vector<TarEntry>& entries) {
  std::vector<std::uint8_t> out(64 << 20);
  std::size_t used = 0;
  archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax_restricted(a);
  archive_write_open_memory(a, out.data(), out.size(), &used);
  for (const TarEntry& e : entries) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, e.name.c_str());
    if (e.directory) {
      archive_entry_set_filetype(entry, AE_IFDIR);
      archive_entry_set_perm(entry, 0755);
    } else if (!e.symlink_to.empty()) {
      archive_entry_set_filetype(entry, AE_IFLNK);
      archive_entry_set_symlink(entry, e.symlink_to.c_str());
      archive_entry_set_perm(entry, 0777);
    } else {
      archive_entry_set_filetype(entry, AE_IFREG);
      archive_entry_set_perm(entry, 0644);
      archive_entry_set_size(entry, static_cast<la_int64_t>(e.bytes.size()));
    }
    archive_write_header(a, entry);
    if (!e.bytes.empty()) archive_write_data(a, e.bytes.data(), e.bytes.size());
    archive_entry_free(entry);
  }
  archive_write_close(a);
  archive_write_free(a);
  out.resize(used);
  return out;
}

}  // namespace partrain::data::test_files
