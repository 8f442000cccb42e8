// defines: store_value(), load_value() and reduce_reference() — for the collective tests that
// fill buffers of any dtype with chosen values and check each element of the result against
// a reduction computed here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/communicator.h"

namespace partrain::comm {

// Element i of `data` (of `dtype`) set to v, rounded as the dtype rounds.
inline void store_value(void* data, DType dtype, std::size_t i, double v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(data)[i] = v;
      break;
    case DType::f16:
      static_cast<std::uint16_t*>(data)[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::bf16:
      static_cast<std::uint16_t*>(data)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v);
      break;
    case DType::i64:
      static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v);
      break;
  }
}

// Element i of `data`, widened to double.
inline double load_value(const void* data, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(data)[i];
    case DType::f64:
      return static_cast<const double*>(data)[i];
    case DType::f16:
      return half_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::i32:
      return static_cast<const std::int32_t*>(data)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
  }
  return 0;
}

// `op` over the ranks' values of one element, in exact arithmetic; avg of an integer dtype
// truncates, as integer division does.
inline double reduce_reference(const std::vector<double>& values, ReduceOp op, DType dtype) {
  double sum = 0, lo = 1e300, hi = -1e300;
  for (const double v : values) {
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::sum:
      return sum;
    case ReduceOp::min:
      return lo;
    case ReduceOp::max:
      return hi;
    case ReduceOp::avg: {
      const double world = static_cast<double>(values.size());
      return is_floating(dtype) ? sum / world : std::trunc(sum / world);
    }
  }
  return 0;
}

}  // namespace partrain::comm
