// defines: temp_path_for(), sync_file(), sync_directory(), commit_file(), write_temp_file()
// and write_file_atomically() — files are written under a temp name next to their final path,
// flushed to disk, and renamed into place, so a reader (or a machine that lost power) never
// sees half a file.
#pragma once

#include <string>
#include <string_view>

namespace partrain {

// A fresh name in the same directory as `path` (so the rename stays on one file system),
// unique per process and call.
std::string temp_path_for(const std::string& path);

// Flushes a written file to stable storage (fsync; _commit on Windows). Throws UsageError
// naming the path when it cannot.
void sync_file(const std::string& path);

// Flushes a directory's entries (a rename in it) to stable storage. POSIX only: on Windows
// directory entries are committed with the file, and directories cannot be opened to sync.
void sync_directory(const std::string& dir);

// Renames `temp_path` (already written and synced) over `path`, then syncs the directory so
// the rename itself survives a crash. On failure removes temp_path and throws UsageError.
void commit_file(const std::string& temp_path, const std::string& path);

// Writes `bytes` to a temp name beside `path` and syncs it; returns the temp name, for
// commit_file. On failure removes the temp file and throws UsageError naming the path.
std::string write_temp_file(const std::string& path, std::string_view bytes);

// write_temp_file, then commit_file over `path`.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace partrain
