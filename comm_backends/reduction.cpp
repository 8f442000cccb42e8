#include "comm_backends/reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/errors.h"

namespace partrain::comm {

DType accumulator_type(DType data) {
  return (data == DType::f16 || data == DType::bf16) ? DType::f32 : data;
}

namespace {

template <typename T, typename Load>
void reduce_loop(T* acc, std::size_t count, ReduceOp op, Load load) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < count; ++i) acc[i] += load(i);
      break;
    case ReduceOp::min:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::min(acc[i], load(i));
      break;
    case ReduceOp::max:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::max(acc[i], load(i));
      break;
  }
}

template <typename T>
void reduce_same(void* acc, const void* in, std::size_t count, ReduceOp op) {
  T* __restrict a = static_cast<T*>(acc);
  const T* __restrict b = static_cast<const T*>(in);
  reduce_loop(a, count, op, [b](std::size_t i) { return b[i]; });
}

}  // namespace

void reduce_into(void* acc, DType acc_type, const void* in, DType in_type, std::size_t count,
                 ReduceOp op) {
  if (count == 0) return;
  if (acc_type == in_type) {
    switch (acc_type) {
      case DType::f32:
        return reduce_same<float>(acc, in, count, op);
      case DType::f64:
        return reduce_same<double>(acc, in, count, op);
      case DType::i32:
        return reduce_same<std::int32_t>(acc, in, count, op);
      case DType::i64:
        return reduce_same<std::int64_t>(acc, in, count, op);
      default:
        break;
    }
  } else if (acc_type == DType::f32 && (in_type == DType::f16 || in_type == DType::bf16)) {
    // Widen a block at a time into a small buffer, then reduce: two tight loops that the
    // compiler vectorises, instead of one with a conversion call per element.
    constexpr std::size_t kBlock = 2048;
    float widened[kBlock];
    float* a = static_cast<float*>(acc);
    const auto* b = static_cast<const std::uint16_t*>(in);
    for (std::size_t done = 0; done < count; done += kBlock) {
      const std::size_t n = std::min(kBlock, count - done);
      widen_from_wire(b + done, widened, in_type, n);
      reduce_same<float>(a + done, widened, n, op);
    }
    return;
  }
  throw UsageError(
      detail::concat("cannot reduce ", dtype_name(in_type), " into ", dtype_name(acc_type)));
}

namespace {

// No __restrict: out may be a or b. GCC's runtime overlap check lets out == b (every step of a
// chain but the first, an overlap at distance 0) take the vector loop, as fast as a loop of
// __restrict pointers.
template <typename T>
void reduce_pair_of(T* out, const T* a, const T* b, std::size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
      break;
    case ReduceOp::min:
      for (std::size_t i = 0; i < count; ++i) out[i] = std::min(a[i], b[i]);
      break;
    case ReduceOp::max:
      for (std::size_t i = 0; i < count; ++i) out[i] = std::max(a[i], b[i]);
      break;
  }
}

}  // namespace

void reduce_pair(void* out, const void* a, const void* b, DType type, std::size_t count,
                 ReduceOp op) {
  switch (type) {
    case DType::f32:
      return reduce_pair_of(static_cast<float*>(out), static_cast<const float*>(a),
                            static_cast<const float*>(b), count, op);
    case DType::f64:
      return reduce_pair_of(static_cast<double*>(out), static_cast<const double*>(a),
                            static_cast<const double*>(b), count, op);
    case DType::i32:
      return reduce_pair_of(static_cast<std::int32_t*>(out), static_cast<const std::int32_t*>(a),
                            static_cast<const std::int32_t*>(b), count, op);
    case DType::i64:
      return reduce_pair_of(static_cast<std::int64_t*>(out), static_cast<const std::int64_t*>(a),
                            static_cast<const std::int64_t*>(b), count, op);
    default:
      throw UsageError(detail::concat("reduce_pair: ", dtype_name(type), " is not reduced as is"));
  }
}

namespace {

// Blocks small enough to stay in L1 between the passes of reduce_from_wire().
constexpr std::size_t kWireBlock = 1024;

void narrow_bf16(const float* __restrict in, std::uint16_t* __restrict out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof bits);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (bits >> 16) | 0x40u;  // rounding must not turn nan into inf
    out[i] = static_cast<std::uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

void widen_bf16(const std::uint16_t* __restrict in, float* __restrict out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof bits);
  }
}

}  // namespace

void narrow_to_wire(const float* in, std::uint16_t* out, DType wire, std::size_t count) {
  if (wire == DType::bf16) return narrow_bf16(in, out, count);
  convert_elements(in, DType::f32, out, wire, count);
}

void widen_from_wire(const std::uint16_t* in, float* out, DType wire, std::size_t count) {
  if (wire == DType::bf16) return widen_bf16(in, out, count);
  convert_elements(in, wire, out, DType::f32, count);
}

void reduce_from_wire(float* acc, std::uint16_t* words, DType wire, std::size_t count, ReduceOp op,
                      bool last, int divisor) {
  PARTRAIN_CHECK(wire == DType::f16 || wire == DType::bf16, UsageError,
                 "reduce_from_wire: ", dtype_name(wire), " is not a wire type");
  float widened[kWireBlock];
  for (std::size_t done = 0; done < count; done += kWireBlock) {
    const std::size_t n = std::min(kWireBlock, count - done);
    float* a = acc + done;
    std::uint16_t* w = words + done;
    widen_from_wire(w, widened, wire, n);
    reduce_same<float>(a, widened, n, op);
    if (last && divisor != 1) divide_elements(a, DType::f32, n, divisor);
    narrow_to_wire(a, w, wire, n);
    if (last) widen_from_wire(w, a, wire, n);
  }
}

void divide_elements(void* acc, DType acc_type, std::size_t count, int divisor) {
  switch (acc_type) {
    case DType::f32: {
      float* a = static_cast<float*>(acc);
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) a[i] /= d;
      return;
    }
    case DType::f64: {
      double* a = static_cast<double*>(acc);
      for (std::size_t i = 0; i < count; ++i) a[i] /= divisor;
      return;
    }
    case DType::i32: {
      auto* a = static_cast<std::int32_t*>(acc);
      for (std::size_t i = 0; i < count; ++i) a[i] /= divisor;
      return;
    }
    case DType::i64: {
      auto* a = static_cast<std::int64_t*>(acc);
      for (std::size_t i = 0; i < count; ++i) a[i] /= divisor;
      return;
    }
    default:
      throw UsageError(detail::concat("cannot divide ", dtype_name(acc_type), " elements"));
  }
}

}  // namespace partrain::comm
