// defines: accumulator_type(), reduce_into(), reduce_pair(), divide_elements(), narrow_to_wire(),
// widen_from_wire(), reduce_from_wire() — the elementwise kernels of the CPU collectives.
//
// Reductions accumulate in f32 for f32/f16/bf16 data (and in the data's own type for f64,
// i32, i64); a narrower input (a reduced-precision wire chunk) is widened on the fly.
// The wire kernels run once per byte the ring moves, so they are plain loops over 16-bit
// words that the compiler vectorises (bf16 is the top half of an f32, rounded to nearest even);
// f16 goes through the scalar conversions of buffer.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm_backends/buffer.h"

namespace partrain::comm {

DType accumulator_type(DType data);

// acc[i] = op(acc[i], in[i]); in_type is acc_type or, for an f32 accumulator, f16/bf16.
// avg reduces as sum; the division happens once, in divide_elements().
void reduce_into(void* acc, DType acc_type, const void* in, DType in_type, std::size_t count,
                 ReduceOp op);

// out[i] = op(a[i], b[i]) for one type of f32, f64, i32 or i64, the operands in the order
// reduce_into() takes them (a: the value a rank holds, b: what it reduces into it), so that a
// chain of these gives reduce_into()'s bits; out may be a or b.
void reduce_pair(void* out, const void* a, const void* b, DType type, std::size_t count,
                 ReduceOp op);

// acc[i] /= divisor (integer division for integer types).
void divide_elements(void* acc, DType acc_type, std::size_t count, int divisor);

// Wire words <-> f32 for a wire type of f16 or bf16 (same bits as convert_elements()).
void narrow_to_wire(const float* in, std::uint16_t* out, DType wire, std::size_t count);
void widen_from_wire(const std::uint16_t* in, float* out, DType wire, std::size_t count);

// One arrived wire chunk of a reduce-scatter step, in one pass while it is in cache:
// acc[i] = op(acc[i], words[i]), then words[i] = the result in wire format, ready to forward.
// With `last` (the step after which this rank owns the chunk's final value) the result is first
// divided by `divisor` (avg; 1 for none) and acc[i] is rounded to the wire type as well, so the
// owner ends with the same bits as every rank that receives the words.
void reduce_from_wire(float* acc, std::uint16_t* words, DType wire, std::size_t count, ReduceOp op,
                      bool last, int divisor);

}  // namespace partrain::comm
