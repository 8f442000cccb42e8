// defines: RingCollectives — allreduce, broadcast, allgather and barrier over a RingTransport.
//
// Note [Ring allreduce]
// The buffer is cut into W *segments*, one per rank. In step s (0 <= s < 2(W-1)) rank r sends
// segment (r - s) mod W to its right and receives segment (r - s - 1) mod W from its left:
//
//   steps 0 .. W-2   reduce-scatter: the received segment is reduced into ours, so after
//                    W-1 steps rank r holds the full reduction of segment (r + 1) mod W;
//   steps W-1 ..     allgather: the received segment (already final) replaces ours.
//
// What a rank sends in step s+1 is what it received in step s, so each segment is further
// cut into *chunks*, and chunk c of step s+1 leaves as soon as chunk c of step s has arrived
// and been reduced — not when the whole segment has. Sends and receives run on separate
// sockets (full duplex), so while we reduce one chunk the kernel is already moving the next
// one in and the previous one out. Every rank moves 2(W-1)/W of the buffer each way: the
// bandwidth-optimal amount, hence busbw = algbw * 2(W-1)/W.
//
// f16/bf16 data are widened to an f32 work copy, so sums accumulate in f32. With a
// reduced-precision wire (f32 data, wire f16/bf16) each chunk is narrowed to send and widened
// on arrival; the owner of a segment rounds its final values to the wire type too, so every
// rank ends with the same bits. Each collective opens with a frame header (kind, sequence
// number, count, dtypes, op, root) that the receiver checks against its own call, so ranks
// that disagree fail with a message instead of mixing up bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/ring/ring_transport.h"

namespace partrain::comm {

inline constexpr std::size_t kDefaultRingChunkBytes = 256 << 10;

class RingCollectives {
 public:
  RingCollectives(RingTransport& transport, std::chrono::milliseconds timeout,
                  std::size_t chunk_bytes = kDefaultRingChunkBytes);

  // wire: f32 (exact) or f16/bf16 for floating data; ignored for f64 and integers.
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, DType wire);
  void broadcast(void* data, std::size_t bytes, int root);
  void allgather(const void* in, void* out, std::size_t bytes_per_rank);
  void barrier();

 private:
  struct Header;
  struct Pass;
  void run_pass(Pass& pass, const Header& header);

  RingTransport& transport_;
  std::chrono::milliseconds timeout_;
  std::size_t chunk_bytes_;
  std::uint64_t sequence_ = 0;
  std::vector<std::uint8_t> work_;        // f32 copy of f16/bf16 data
  std::vector<std::uint8_t> send_stage_;  // a chunk narrowed to the wire type
  std::vector<std::uint8_t> recv_stage_;  // a received chunk waiting to be reduced
};

}  // namespace partrain::comm
