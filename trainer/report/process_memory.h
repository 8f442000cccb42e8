// defines: peak_rss_mb() — the high-water mark of this process's resident memory, the host
// side of what a run report says about memory (device_memory.h is the CUDA side).
#pragma once

namespace partrain {

double peak_rss_mb();  // MiB

}  // namespace partrain
