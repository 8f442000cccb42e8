// defines: temp_path_for(), commit_file() and write_file_atomically() — files are written
// under a temp name next to their final path and renamed into place, so a reader never sees
// half a file.
#pragma once

#include <string>
#include <string_view>

namespace partrain::data {

// A fresh name in the same directory as `path` (so the rename stays on one file system),
// unique per process and call.
std::string temp_path_for(const std::string& path);

// Renames `temp_path` over `path`; on failure removes temp_path and throws UsageError.
void commit_file(const std::string& temp_path, const std::string& path);

// Writes `bytes` to a temp name and commits it over `path`; on failure removes the temp file
// and throws UsageError naming the path.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace partrain::data
