// defines: count_cpu_tensor_memory(), cpu_tensor_bytes(), cpu_tensor_peak_bytes() and
// reset_cpu_tensor_peak() — the bytes of CPU tensors alive now and at most since a mark,
// counted by an allocator installed in front of LibTorch's own: the measured part of the
// memory breakdown that no tensor can be asked for (what forward and backward allocate). The
// same allocator places blocks of 1 MiB and more in a BlockArena (common/block_arena.h), so
// that ranks doing the same work hold the same memory.
#pragma once

#include <cstdint>

namespace partrain {

// Installs the counting (and large-block placing) allocator, once per process (later calls do
// nothing). Tensors allocated before keep LibTorch's allocator and are never counted.
void count_cpu_tensor_memory();
std::int64_t cpu_tensor_bytes();       // alive now
std::int64_t cpu_tensor_peak_bytes();  // the most alive at once since reset_cpu_tensor_peak()
void reset_cpu_tensor_peak();          // the peak starts again from what is alive now

}  // namespace partrain
