// defines: the few operating-system questions the trainer asks — peak resident memory,
// whether stdout is a terminal, the OS name. The only trainer file with OS headers.
#pragma once

#include <string>

namespace partrain {

double peak_rss_mb();  // high-water mark of this process's resident set, MiB
bool stdout_is_terminal();
std::string os_name();  // "linux", "windows", "macos"

}  // namespace partrain

namespace partrain {
// Flushes a written file to stable storage (fsync), so a rename after it publishes whole
// contents even across a power cut. Throws Error when the file cannot be synced.
void sync_file(const std::string& path);
}  // namespace partrain
