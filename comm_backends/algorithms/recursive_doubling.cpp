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
//
// Note [Pipelined exchange]
// Each exchange of recursive doubling, and of Rabenseifner's halving and doubling
// (rabenseifner.cpp), goes through pipelined_exchange(): both directions cut into pieces of the
// ring's chunk, one piece each way in flight, and each piece that has arrived is reduced while
// the kernel moves the next. Sent whole, a 2 MiB message took one 0.7 ms send() on loopback
// (strace), and the receiver reduced nothing until its last byte was in; in pieces the bytes
// in flight stay in cache and the reduction overlaps the copy. Forced at W=2, a rank to a core,
// medians of six rounds (BENCHMARKS.md, "Pipelined exchanges"): recursive doubling 1.65x
// faster at 1 MiB and 1.17x at 4 MiB, Rabenseifner 1.78x at 4 MiB and level at 16 MiB.
// Where ranks share cores the pieces did not pay: at 8 ranks on two cores recursive doubling
// took 1.18x longer at 1 MiB and Rabenseifner 1.03-1.06x longer from 1 to 16 MiB. So
// PeerCollectives cuts exchanges into pieces unless HostLayout::shares_cores(), and learns the
// layout at its first such call of more than one chunk to know (peer_collectives.cpp).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>

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

}  // namespace

void pipelined_exchange(PeerTransport& t, int peer, const Piecewise& out, const Piecewise& in,
                        std::size_t piece_bytes, bool overwrites_out,
                        const std::function<void(std::size_t, std::size_t)>& arrived) {
  // One piece each way in flight: the kernel moves the next ones while `arrived` reduces.
  // Each direction starts at least one message, even of no bytes: the first message to a peer
  // in a collective carries the frame header both ways.
  auto piece = [&](const Piecewise& w, std::size_t from) {
    return std::min(w.bytes - from, std::max(piece_bytes / w.unit, std::size_t{1}) * w.unit);
  };
  struct Direction {
    PeerTransport::Transfer transfer;
    const Piecewise* buffer = nullptr;
    std::size_t posted = 0;  // bytes handed to the transport so far
    std::size_t done = 0;    // of them, bytes that have moved
    bool started = false, in_flight = false;
  };
  Direction send, recv;
  send.transfer.peer = recv.transfer.peer = peer;
  send.transfer.outgoing = true;
  send.buffer = &out;
  recv.buffer = &in;
  auto post = [&](Direction& d) {
    if (d.in_flight || (d.started && d.posted == d.buffer->bytes)) return;
    d.transfer.data = static_cast<std::uint8_t*>(d.buffer->data) + d.posted;
    d.transfer.bytes = piece(*d.buffer, d.posted);
    d.posted += d.transfer.bytes;
    d.started = d.in_flight = true;
    t.start(d.transfer);
  };
  // Accounts for a piece that has moved (perhaps whole in start()) and posts the next.
  auto finish = [&](Direction& d) {
    if (!d.in_flight || !d.transfer.done()) return false;
    d.done = d.posted;
    d.in_flight = false;
    post(d);
    return true;
  };
  std::size_t handed = 0;
  post(send);
  post(recv);
  // Bounded by the transport's deadline: progress() throws once it passes.
  for (;;) {
    for (bool moved = true; moved;) {
      moved = finish(send);
      moved = finish(recv) || moved;
    }
    // Hand over what has arrived (and, where `out` is overwritten and not all of it has left,
    // has also left).
    const bool wait_for_send = overwrites_out && send.done < out.bytes;
    const std::size_t ready = wait_for_send ? std::min(recv.done, send.done) : recv.done;
    if (ready > handed) {
      arrived(handed, ready - handed);
      handed = ready;
    }
    if (!send.in_flight && !recv.in_flight) break;
    t.progress();
  }
}

namespace {

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
                                  std::size_t count, std::size_t piece_bytes, Scratch& s) {
  const Fold fold(t.rank(), t.size());
  fold_in_reduce(t, fold, r, work, count, s);
  if (fold.new_rank >= 0) {
    for (int mask = 1; mask < fold.pow2; mask <<= 1) {
      const int partner = fold.new_rank ^ mask;
      void* out = outgoing(r, work, count, s);
      void* in = incoming(r, count, s);
      // The lower rank's values first, on both ranks: the same bits whatever the op.
      const bool lower = fold.new_rank < partner;
      const std::size_t wi = r.wire_elem(), we = r.work_elem();
      pipelined_exchange(
          t, fold.last_of(partner), {out, count * wi, wi}, {in, count * wi, wi}, piece_bytes,
          !r.narrow(), [&](std::size_t at, std::size_t bytes) {
            const std::size_t first = at / wi, n = bytes / wi;
            std::uint8_t* mine = work + first * we;
            if (r.narrow()) {
              const auto* low = static_cast<const std::uint16_t*>(lower ? out : in) + first;
              const auto* high = static_cast<const std::uint16_t*>(lower ? in : out) + first;
              widen_from_wire(low, reinterpret_cast<float*>(mine), r.wire, n);
              reduce_into(mine, r.work, high, r.wire, n, r.op);
            } else if (lower) {
              reduce_into(mine, r.work, static_cast<std::uint8_t*>(in) + at, r.work, n, r.op);
            } else {
              std::uint8_t* theirs = static_cast<std::uint8_t*>(in) + at;
              reduce_into(theirs, r.work, mine, r.work, n, r.op);
              std::memcpy(mine, theirs, bytes);
            }
          });
    }
    finish_values(r, work, count, s);
  }
  fold_out_result(t, fold, r, work, count, s);
}

void doubling_allgather_core(PeerTransport& t, const Fold& fold, Positions order,
                             std::uint8_t* data, const Bounds& blocks, std::size_t piece_bytes) {
  const int x = fold.position(fold.new_rank, order);
  for (int mask = 1; mask < fold.pow2; mask <<= 1) {
    const int partner = x ^ mask;
    const int mine = x & ~(mask - 1), theirs = partner & ~(mask - 1);
    const std::size_t sent = blocks[mine + mask] - blocks[mine];
    const std::size_t taken = blocks[theirs + mask] - blocks[theirs];
    pipelined_exchange(t, fold.last_of(fold.position(partner, order)),
                       {data + blocks[mine], sent, 1}, {data + blocks[theirs], taken, 1},
                       piece_bytes, false, [](std::size_t, std::size_t) {});
  }
}

void recursive_doubling_allgather(PeerTransport& t, std::uint8_t* data, const Bounds& blocks,
                                  std::size_t piece_bytes) {
  const Fold fold(t.rank(), t.size());
  const int rank = t.rank();
  if (fold.hands_over()) {
    transfer(t, rank + 1, true, data + blocks[rank], blocks[rank + 1] - blocks[rank]);
  } else if (fold.takes_over()) {
    transfer(t, rank - 1, false, data + blocks[rank - 1], blocks[rank] - blocks[rank - 1]);
  }
  if (fold.new_rank >= 0)
    doubling_allgather_core(t, fold, Positions::in_rank_order, data, fold.fold_bounds(blocks),
                            piece_bytes);
  if (fold.takes_over()) {
    transfer(t, rank - 1, true, data, blocks.back());
  } else if (fold.hands_over()) {
    transfer(t, rank + 1, false, data, blocks.back());
  }
}

}  // namespace partrain::comm
