#include "comm_backends/buffer.h"

#include <cmath>
#include <cstring>

#include "common/errors.h"

namespace partrain::comm {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    if (name == dtype_name(t)) return t;
  }
  throw UsageError(
      detail::concat("unknown dtype '", name, "' (expected one of f32, f64, f16, bf16, i32, i64)"));
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    if (name == reduce_op_name(op)) return op;
  }
  throw UsageError(
      detail::concat("unknown reduce op '", name, "' (expected one of sum, avg, min, max)"));
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

namespace {
std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
}  // namespace

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan (nan keeps a quiet bit)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Below the smallest normal half: round value / 2^-24 to the nearest even integer.
    const float scaled = bits_float(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // nearest, ties to even
  return static_cast<std::uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

float bf16_to_float(std::uint16_t bits) {
  return bits_float(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

namespace {
float to_f32(const void* src, DType type, std::size_t i) {
  switch (type) {
    case DType::f32:
      return static_cast<const float*>(src)[i];
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(src)[i]);
    case DType::f16:
      return half_to_float(static_cast<const std::uint16_t*>(src)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    default:
      return 0.0f;
  }
}
}  // namespace

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type,
                      std::size_t count) {
  if (src_type == dst_type) {
    if (src != dst && count > 0) std::memcpy(dst, src, count * dtype_size(src_type));
    return;
  }
  PARTRAIN_CHECK(is_floating(src_type) && is_floating(dst_type), UsageError, "cannot convert ",
                 dtype_name(src_type), " to ", dtype_name(dst_type));
  // The common wire conversions get tight loops; the rest go element by element.
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const float* in = static_cast<const float*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
    return;
  }
  if (src_type == DType::f32 && dst_type == DType::f16) {
    const float* in = static_cast<const float*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) out[i] = float_to_half(in[i]);
    return;
  }
  if (src_type == DType::f16 && dst_type == DType::f32) {
    const auto* in = static_cast<const std::uint16_t*>(src);
    float* out = static_cast<float*>(dst);
    for (std::size_t i = 0; i < count; ++i) out[i] = half_to_float(in[i]);
    return;
  }
  if (src_type == DType::bf16 && dst_type == DType::f32) {
    const auto* in = static_cast<const std::uint16_t*>(src);
    float* out = static_cast<float*>(dst);
    for (std::size_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
    return;
  }
  if (dst_type == DType::f64) {
    double* out = static_cast<double*>(dst);
    for (std::size_t i = 0; i < count; ++i) out[i] = to_f32(src, src_type, i);
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const float v = src_type == DType::f64 ? static_cast<float>(static_cast<const double*>(src)[i])
                                           : to_f32(src, src_type, i);
    switch (dst_type) {
      case DType::f32:
        static_cast<float*>(dst)[i] = v;
        break;
      case DType::f16:
        static_cast<std::uint16_t*>(dst)[i] = float_to_half(v);
        break;
      case DType::bf16:
        static_cast<std::uint16_t*>(dst)[i] = float_to_bf16(v);
        break;
      default:
        break;
    }
  }
}

}  // namespace partrain::comm
