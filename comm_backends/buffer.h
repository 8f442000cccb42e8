// defines: DType, ReduceOp, Device, Buffer — what a collective works on, with no tensor type —
// and the f16/bf16 <-> f32 conversions every backend shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace partrain::comm {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64 };
enum class ReduceOp : std::uint8_t { sum, avg, min, max };
enum class DeviceKind : std::uint8_t { cpu, cuda };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // throws UsageError naming the accepted values
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);

// A view of `count` elements of `dtype` at `data`; on CUDA, `device_index` is the device
// holding it.
//
// On CUDA, `stream` is the caller's cudaStream_t (nullptr: the legacy default stream, where
// LibTorch computes unless told otherwise). nccl does not run on it: it runs on a stream of
// its own, after `ready_event` (a cudaEvent_t the caller recorded on `stream` when the data
// was complete) or, without one, after all the work queued on `stream` so far, and returns
// once the result is in device memory, so that whatever the caller queues next sees it.
// With a ready event, work queued on `stream` after it neither delays the collective nor
// waits for it. The host backends take host buffers only; HostStaging (cuda_stream.h)
// brings CUDA data to them with the same ordering.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements, never bytes
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;
  int device_index = 0;
  void* stream = nullptr;
  void* ready_event = nullptr;

  std::size_t bytes() const { return count * dtype_size(dtype); }
};

bool is_floating(DType dtype);

// IEEE binary16 and bfloat16 held as raw bits; narrowing rounds to nearest even.
float half_to_float(std::uint16_t bits);
std::uint16_t float_to_half(float value);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);

// Converts `count` elements between f32, f64, f16 and bf16 (any pair, same type = copy).
// Integer types are only copied to themselves. `src` and `dst` must not overlap unless equal.
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type,
                      std::size_t count);

}  // namespace partrain::comm
