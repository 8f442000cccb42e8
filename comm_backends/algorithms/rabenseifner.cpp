// Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an allgather by
// recursive doubling. 2 log2(W) messages, like recursive doubling's log2(W) twice, but each
// rank sends and receives only 2(W-1)/W of the buffer, as the ring does: the algorithm for
// messages too large for recursive doubling and too small for the ring's 2(W-1) messages.
//
// Recursive halving: the blocks of the new ranks (Fold) form a window, at first all of them.
// In step mask = pow2/2, pow2/4, ..., 1 position x keeps the half of its window on its side of
// bit `mask` (the lower half when x & mask is 0), sends the other half to position x ^ mask
// and reduces the half it keeps with what that one sends; the window halves. After the last
// step position x alone holds the reduction of block x, divided (avg) and, on a narrow wire,
// rounded to the wire type; every element is reduced by one rank only, so no rank can hold
// other bits. The allgather then spreads the blocks (recursive_doubling.cpp), on a narrow wire
// as words.
//
// Note [Nearest partner first]
// Which rank stands at which position decides who exchanges the most. reduce_scatter must end
// with block r on rank r, so there position = new rank, and the first and largest exchange
// (half the buffer) is with the rank pow2/2 away. The allreduce is free to place the blocks:
// there position = the new rank's bits reversed, so that the halving exchanges half the buffer
// with the next rank (new rank ^ 1), a quarter with new rank ^ 2, and the smallest pieces with
// the farthest, and the allgather mirrors it. Ranks are numbered host by host (launchers give
// a host consecutive ranks), so the large exchanges stay on a host and the link between hosts
// carries (H-1)/H of the buffer each way per host where the ring carries (W-1)/W per boundary:
// at 2 hosts of 2 ranks, 1 buffer where the ring carries 1.5 (algorithm_choice.h's HostTraffic
// counts it for any layout). On one host the order changes only which ranks add in which order.
#include <cstdint>
#include <cstring>

#include "comm_backends/algorithms/algorithms.h"
#include "comm_backends/reduction.h"

namespace partrain::comm {
namespace {

// Halving among the fold's new ranks over `blocks` (pow2 + 1 bounds, in elements), with the
// new ranks at positions `order` (Note [Nearest partner first]).
void halving_core(PeerTransport& t, const Fold& fold, Positions order, const Reduction& r,
                  std::uint8_t* work, const Bounds& blocks, std::size_t piece_bytes, Scratch& s) {
  const int x = fold.position(fold.new_rank, order);
  const std::size_t count = blocks.back();
  const std::size_t we = r.work_elem(), wi = r.wire_elem();
  if (r.narrow()) {
    s.words.resize(std::max(s.words.size(), count));
    s.theirs.resize(std::max(s.theirs.size(), count));
  } else {
    // The blocks of a fold may be uneven: the half kept can be most of the buffer.
    s.stage.resize(std::max(s.stage.size(), count * we));
  }
  for (int mask = fold.pow2 / 2; mask >= 1; mask >>= 1) {
    const int partner = x ^ mask;
    const int base = x & ~(2 * mask - 1);
    const std::size_t lo = blocks[base], mid = blocks[base + mask], hi = blocks[base + 2 * mask];
    const bool upper = (x & mask) != 0;
    const std::size_t keep = upper ? mid : lo, keep_n = upper ? hi - mid : mid - lo;
    const std::size_t give = upper ? lo : mid, give_n = upper ? mid - lo : hi - mid;
    void* out;
    void* in;
    if (r.narrow()) {
      std::uint16_t* words = s.words.data() + give;
      narrow_to_wire(reinterpret_cast<const float*>(work) + give, words, r.wire, give_n);
      out = words;
      in = s.theirs.data();
    } else {
      out = work + give * we;
      in = s.stage.data();
    }
    // The half kept is reduced piece by piece as it arrives; the half given is not written.
    pipelined_exchange(t, fold.last_of(fold.position(partner, order)), {out, give_n * wi, wi},
                       {in, keep_n * wi, wi}, piece_bytes, false,
                       [&](std::size_t at, std::size_t bytes) {
                         const std::size_t first = at / wi;
                         reduce_into(work + (keep + first) * we, r.work,
                                     static_cast<std::uint8_t*>(in) + at, r.wire, bytes / wi, r.op);
                       });
    if (mask == 1) finish_values(r, work + keep * we, keep_n, s);
  }
  if (fold.pow2 == 1) finish_values(r, work, count, s);
}

}  // namespace

void rabenseifner_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                            std::size_t count, std::size_t piece_bytes, Scratch& s) {
  const Fold fold(t.rank(), t.size());
  fold_in_reduce(t, fold, r, work, count, s);
  if (fold.new_rank >= 0) {
    const Bounds blocks = equal_bounds(count, fold.pow2);
    halving_core(t, fold, Positions::nearest_first, r, work, blocks, piece_bytes, s);
    const int at = fold.position(fold.new_rank, Positions::nearest_first);
    if (r.narrow()) {
      // The final values travel as wire words; this rank's own are already wire values.
      const std::size_t mine = blocks[at], n = blocks[at + 1] - mine;
      s.words.resize(std::max(s.words.size(), count));
      narrow_to_wire(reinterpret_cast<const float*>(work) + mine, s.words.data() + mine, r.wire, n);
      doubling_allgather_core(t, fold, Positions::nearest_first,
                              reinterpret_cast<std::uint8_t*>(s.words.data()),
                              scaled(blocks, r.wire_elem()), piece_bytes);
      widen_from_wire(s.words.data(), reinterpret_cast<float*>(work), r.wire, count);
    } else {
      doubling_allgather_core(t, fold, Positions::nearest_first, work,
                              scaled(blocks, r.work_elem()), piece_bytes);
    }
  }
  fold_out_result(t, fold, r, work, count, s);
}

void recursive_halving_reduce_scatter(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                                      const Bounds& blocks, std::size_t piece_bytes, Scratch& s) {
  const Fold fold(t.rank(), t.size());
  const std::size_t count = blocks.back();
  fold_in_reduce(t, fold, r, work, count, s);
  if (fold.new_rank >= 0) {
    halving_core(t, fold, Positions::in_rank_order, r, work, fold.fold_bounds(blocks), piece_bytes,
                 s);
  }
  // The odd rank of a pair holds both ranks' blocks: the even one's goes back to it.
  const int rank = t.rank();
  if (!fold.takes_over() && !fold.hands_over()) return;
  const int even = fold.takes_over() ? rank - 1 : rank;
  const std::size_t at = blocks[even], n = blocks[even + 1] - at;
  PeerTransport::Transfer one;
  one.peer = fold.takes_over() ? rank - 1 : rank + 1;
  one.outgoing = fold.takes_over();
  one.bytes = n * r.wire_elem();
  if (!r.narrow()) {
    one.data = work + at * r.work_elem();
  } else {
    s.words.resize(std::max(s.words.size(), count));
    std::uint16_t* words = s.words.data() + at;
    if (one.outgoing) narrow_to_wire(reinterpret_cast<const float*>(work) + at, words, r.wire, n);
    one.data = words;
  }
  t.start(one);
  t.wait(one);
  if (!one.outgoing && r.narrow()) {
    widen_from_wire(s.words.data() + at, reinterpret_cast<float*>(work) + at, r.wire, n);
  }
}

}  // namespace partrain::comm
