// defines: accumulator_type(), reduce_into(), divide_elements() — the elementwise kernels of
// the CPU collectives.
//
// Reductions accumulate in f32 for f32/f16/bf16 data (and in the data's own type for f64,
// i32, i64); a narrower input (a reduced-precision wire chunk) is widened on the fly.
#pragma once

#include <cstddef>

#include "comm_backends/buffer.h"

namespace partrain::comm {

DType accumulator_type(DType data);

// acc[i] = op(acc[i], in[i]); in_type is acc_type or, for an f32 accumulator, f16/bf16.
// avg reduces as sum; the division happens once, in divide_elements().
void reduce_into(void* acc, DType acc_type, const void* in, DType in_type, std::size_t count,
                 ReduceOp op);

// acc[i] /= divisor (integer division for integer types).
void divide_elements(void* acc, DType acc_type, std::size_t count, int divisor);

}  // namespace partrain::comm
