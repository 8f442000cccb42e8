// defines: peak_rss_mb() and rss_mb() — the high-water mark of this process's resident memory
// and its resident memory now, the host side of what a run report says about memory
// (device_memory.h is the CUDA side).
#pragma once

namespace partrain {

double peak_rss_mb();  // MiB
double rss_mb();       // MiB; 0 where the platform cannot tell

}  // namespace partrain
