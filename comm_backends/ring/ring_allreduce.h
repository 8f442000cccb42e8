// defines: RingCollectives — allreduce, broadcast, allgather and barrier over a RingTransport.
// The algorithm and its wire format: Note [Ring allreduce] in ring_allreduce.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/ring/ring_transport.h"

namespace partrain::comm {

inline constexpr std::size_t kDefaultRingChunkBytes = 256 << 10;
inline constexpr std::size_t kRingFrameHeaderBytes = 32;

class RingCollectives {
 public:
  RingCollectives(RingTransport& transport, std::chrono::milliseconds timeout,
                  std::size_t chunk_bytes = kDefaultRingChunkBytes);

  // wire: f32 (exact) or f16/bf16 for floating data; ignored for f64 and integers.
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, DType wire);
  void broadcast(void* data, std::size_t bytes, int root);
  void allgather(const void* in, void* out, std::size_t bytes_per_rank);
  void barrier();

  // What a frame header received from a neighbour announces, in words (for the message when
  // ranks disagree); "something unrecognisable" when it is not a frame header at all.
  static std::string describe_frame(const std::uint8_t* header);

 private:
  struct Header;
  struct Pass;
  class PassRun;
  void check_usable() const;
  Pass plan_allreduce(std::size_t count, DType acc, DType wire, ReduceOp op) const;
  std::uint8_t* receive_stage(const Pass& pass);
  void run_pass(Pass pass, const Header& header);

  RingTransport& transport_;
  std::chrono::milliseconds timeout_;
  std::size_t chunk_bytes_;
  std::uint64_t sequence_ = 0;
  std::vector<std::uint8_t> work_;        // f32 copy of f16/bf16 data
  std::vector<std::uint16_t> wire_;       // reduced-precision wire: every element's wire word
  std::vector<std::uint8_t> recv_stage_;  // a received chunk waiting to be reduced
};

}  // namespace partrain::comm
