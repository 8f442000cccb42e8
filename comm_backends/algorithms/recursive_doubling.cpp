// Recursive doubling: log2(W) exchanges of the whole buffer, for messages small enough that
// the number of messages in a row, not their bytes, is what costs.
//
// allreduce: in step k (mask = 2^k) rank x exchanges everything with rank x ^ mask and both
// combine the two values, the lower rank's first, so that both hold the same bits; after
// log2(W) steps every rank holds the reduction. On a narrow wire both combine the two ranks'
// wire words (their own rounded as the partner sees it).
//
// allgather: in step k rank x sends the 2^k blocks it holds to x ^ mask and receives as many.
//
// A world that is not a power of two folds first (Fold): two more messages for the ranks that
// pair up, as MPICH does it.
#include <cstdint>
#include <cstring>

#include "comm_backends/algorithms/algorithms.h"
#include "comm_backends/reduction.h"

namespace partrain::comm {

Bounds equal_bounds(std::size_t total, int parts) {
  Bounds bounds(parts + 1);
  for (int i = 0; i <= parts; ++i) bounds[i] = total * i / parts;
  return bounds;
}

Bounds scaled(const Bounds& bounds, std::size_t factor) {
  Bounds out(bounds);
  for (auto& b : out) b *= factor;
  return out;
}

Fold::Fold(int rank_, int world_) : world(world_), rank(rank_), pow2(1) {
  while (pow2 * 2 <= world) pow2 *= 2;
  rem = world - pow2;
  if (rank < 2 * rem) {
    new_rank = rank % 2 == 1 ? rank / 2 : -1;
  } else {
    new_rank = rank - rem;
  }
}

Bounds Fold::fold_bounds(const Bounds& blocks) const {
  Bounds out(pow2 + 1);
  for (int nr = 0; nr < pow2; ++nr) out[nr] = blocks[first_of(nr)];
  out[pow2] = blocks[world];
  return out;
}

int Fold::position(int nr, Positions order) const {
  if (order == Positions::in_rank_order) return nr;
  int reversed = 0;
  for (int bit = 1, mirror = pow2 / 2; bit < pow2; bit <<= 1, mirror >>= 1) {
    if (nr & bit) reversed |= mirror;
  }
  return reversed;
}

namespace {

// What leaves for a peer: the work values themselves, or on a narrow wire their wire words.
void* outgoing(const Reduction& r, std::uint8_t* work, std::size_t count, Scratch& s) {
  if (!r.narrow()) return work;
  s.words.resize(std::max(s.words.size(), count));
  narrow_to_wire(reinterpret_cast<const float*>(work), s.words.data(), r.wire, count);
  return s.words.data();
}

// Where a peer's values arrive.
void* incoming(const Reduction& r, std::size_t count, Scratch& s) {
  if (r.narrow()) {
    s.theirs.resize(std::max(s.theirs.size(), count));
    return s.theirs.data();
  }
  s.stage.resize(std::max(s.stage.size(), count * r.work_elem()));
  return s.stage.data();
}

void exchange(PeerTransport& t, int peer, void* out, void* in, std::size_t bytes) {
  PeerTransport::Transfer send, recv;
  send.peer = recv.peer = peer;
  send.outgoing = true;
  send.data = out;
  recv.data = in;
  send.bytes = recv.bytes = bytes;
  t.start(send);
  t.start(recv);
  t.wait(send, recv);
}

void transfer(PeerTransport& t, int peer, bool outgoing, void* data, std::size_t bytes) {
  PeerTransport::Transfer one;
  one.peer = peer;
  one.outgoing = outgoing;
  one.data = data;
  one.bytes = bytes;
  t.start(one);
  t.wait(one);
}

}  // namespace

void fold_in_reduce(PeerTransport& t, const Fold& fold, const Reduction& r, std::uint8_t* work,
                    std::size_t count, Scratch& s) {
  if (fold.hands_over()) {
    transfer(t, fold.rank + 1, true, outgoing(r, work, count, s), count * r.wire_elem());
  } else if (fold.takes_over()) {
    void* in = incoming(r, count, s);
    transfer(t, fold.rank - 1, false, in, count * r.wire_elem());
    reduce_into(work, r.work, in, r.wire, count, r.op);
  }
}

void fold_out_result(PeerTransport& t, const Fold& fold, const Reduction& r, std::uint8_t* work,
                     std::size_t count, Scratch& s) {
  if (fold.takes_over()) {
    // Final values are already wire values: narrowing them again is exact.
    transfer(t, fold.rank - 1, true, outgoing(r, work, count, s), count * r.wire_elem());
  } else if (fold.hands_over()) {
    if (!r.narrow()) return transfer(t, fold.rank + 1, false, work, count * r.work_elem());
    void* in = incoming(r, count, s);
    transfer(t, fold.rank + 1, false, in, count * r.wire_elem());
    widen_from_wire(static_cast<const std::uint16_t*>(in), reinterpret_cast<float*>(work), r.wire,
                    count);
  }
}

void finish_values(const Reduction& r, std::uint8_t* work, std::size_t count, Scratch& s) {
  if (r.divisor != 1) divide_elements(work, r.work, count, r.divisor);
  if (!r.narrow()) return;
  s.words.resize(std::max(s.words.size(), count));
  narrow_to_wire(reinterpret_cast<const float*>(work), s.words.data(), r.wire, count);
  widen_from_wire(s.words.data(), reinterpret_cast<float*>(work), r.wire, count);
}

void recursive_doubling_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                                  std::size_t count, Scratch& s) {
  const Fold fold(t.rank(), t.size());
  fold_in_reduce(t, fold, r, work, count, s);
  if (fold.new_rank >= 0) {
    for (int mask = 1; mask < fold.pow2; mask <<= 1) {
      const int partner = fold.new_rank ^ mask;
      void* out = outgoing(r, work, count, s);
      void* in = incoming(r, count, s);
      exchange(t, fold.last_of(partner), out, in, count * r.wire_elem());
      // The lower rank's values first, on both ranks: the same bits whatever the op.
      const bool lower = fold.new_rank < partner;
      if (r.narrow()) {
        const auto* low = static_cast<const std::uint16_t*>(lower ? out : in);
        const auto* high = static_cast<const std::uint16_t*>(lower ? in : out);
        widen_from_wire(low, reinterpret_cast<float*>(work), r.wire, count);
        reduce_into(work, r.work, high, r.wire, count, r.op);
      } else if (lower) {
        reduce_into(work, r.work, in, r.work, count, r.op);
      } else {
        reduce_into(in, r.work, work, r.work, count, r.op);
        std::memcpy(work, in, count * r.work_elem());
      }
    }
    finish_values(r, work, count, s);
  }
  fold_out_result(t, fold, r, work, count, s);
}

void doubling_allgather_core(PeerTransport& t, const Fold& fold, Positions order,
                             std::uint8_t* data, const Bounds& blocks) {
  const int x = fold.position(fold.new_rank, order);
  for (int mask = 1; mask < fold.pow2; mask <<= 1) {
    const int partner = x ^ mask;
    const int mine = x & ~(mask - 1), theirs = partner & ~(mask - 1);
    PeerTransport::Transfer send, recv;
    send.peer = recv.peer = fold.last_of(fold.position(partner, order));
    send.outgoing = true;
    send.data = data + blocks[mine];
    send.bytes = blocks[mine + mask] - blocks[mine];
    recv.data = data + blocks[theirs];
    recv.bytes = blocks[theirs + mask] - blocks[theirs];
    t.start(send);
    t.start(recv);
    t.wait(send, recv);
  }
}

void recursive_doubling_allgather(PeerTransport& t, std::uint8_t* data, const Bounds& blocks) {
  const Fold fold(t.rank(), t.size());
  const int rank = t.rank();
  if (fold.hands_over()) {
    transfer(t, rank + 1, true, data + blocks[rank], blocks[rank + 1] - blocks[rank]);
  } else if (fold.takes_over()) {
    transfer(t, rank - 1, false, data + blocks[rank - 1], blocks[rank] - blocks[rank - 1]);
  }
  if (fold.new_rank >= 0)
    doubling_allgather_core(t, fold, Positions::in_rank_order, data, fold.fold_bounds(blocks));
  if (fold.takes_over()) {
    transfer(t, rank - 1, true, data, blocks.back());
  } else if (fold.hands_over()) {
    transfer(t, rank + 1, false, data, blocks.back());
  }
}

}  // namespace partrain::comm
