// defines: Reduction, Bounds, Fold, Scratch — what the collective algorithms share — and the
// algorithms themselves, one file each, every one seeing only a PeerTransport and its buffers:
//
//   ring.cpp                 ring_allreduce, ring_reduce_scatter, ring_allgather,
//                            ring_broadcast (a pipelined chain)      Note [Ring allreduce]
//   recursive_doubling.cpp   recursive_doubling_allreduce, recursive_doubling_allgather
//   rabenseifner.cpp         rabenseifner_allreduce, recursive_halving_reduce_scatter
//   binomial_tree.cpp        binomial_tree_broadcast
//
// Which one a call takes: algorithm_choice.h. Worlds that are not a power of two: Fold.
//
// Every algorithm leaves every rank with the same bits. Reductions run in the work type
// (f32 for f16/bf16 data); on a reduced-precision wire (work f32, wire f16/bf16) what travels
// is rounded to the wire type, and a final value is rounded to it as well wherever it is made,
// so that the ranks that receive it and the rank that made it hold the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/peer/peer_transport.h"

namespace partrain::comm {

// What a reduction combines and how.
struct Reduction {
  DType work = DType::f32;  // the type the values are held and reduced in
  DType wire = DType::f32;  // the type they travel in: work, or f16/bf16 for f32 work
  ReduceOp op = ReduceOp::sum;
  int divisor = 1;  // avg: the world size, applied once to each final value

  bool narrow() const { return wire != work; }
  std::size_t work_elem() const { return dtype_size(work); }
  std::size_t wire_elem() const { return dtype_size(wire); }
};

// Boundaries of consecutive blocks: block i is [at[i], at[i + 1]), in elements or bytes as the
// caller counts; at.size() is the number of blocks + 1.
using Bounds = std::vector<std::size_t>;
// `total` cut into `parts` blocks that differ by at most one.
Bounds equal_bounds(std::size_t total, int parts);
// Each bound multiplied by `factor` (elements to bytes).
Bounds scaled(const Bounds& bounds, std::size_t factor);

// Where a power-of-two algorithm puts each new rank (Note [Nearest partner first] in
// rabenseifner.cpp): at its own number, or at its number's bits reversed, which pairs each rank
// with its nearest neighbours for the steps that move the most.
enum class Positions : std::uint8_t { in_rank_order, nearest_first };

// A world that is not a power of two, folded as MPICH folds it: of the first 2 * rem ranks
// (rem = world - pow2) each even one hands its data to the odd one after it and sits out; the
// pow2 ranks left take new ranks 0 .. pow2-1 in order, run the power-of-two algorithm, and the
// odd ones hand the result back.
struct Fold {
  Fold(int rank, int world);
  int world, rank, pow2, rem;
  int new_rank;  // -1: sits out (an even rank among the first 2 * rem)
  bool hands_over() const { return rank < 2 * rem && rank % 2 == 0; }     // sends, then waits
  bool takes_over() const { return rank < 2 * rem && rank % 2 == 1; }     // receives, reduces
  int first_of(int nr) const { return nr < rem ? 2 * nr : nr + rem; }     // the ranks new rank
  int last_of(int nr) const { return nr < rem ? 2 * nr + 1 : nr + rem; }  // nr stands for
  // Blocks of the new ranks: new rank nr's is the union of the blocks of the ranks it stands
  // for (`blocks` has world + 1 bounds; the result pow2 + 1).
  Bounds fold_bounds(const Bounds& blocks) const;
  // The position of new rank nr under `order`, and (the same map) the new rank at a position.
  int position(int nr, Positions order) const;
};

// Buffers an algorithm reuses from call to call (grown, never shrunk).
struct Scratch {
  std::vector<std::uint8_t> stage;    // a received message waiting to be reduced
  std::vector<std::uint16_t> words;   // narrow wire: the wire words of every element
  std::vector<std::uint16_t> theirs;  // narrow wire: a peer's wire words
};

// ---- ring.cpp ----
// In place on `work` (count elements of r.work); `words` holds count wire words on a narrow
// wire. chunk_bytes: the pipeline's chunk, in work bytes.
void ring_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work, std::size_t count,
                    std::size_t chunk_bytes, Scratch& s);
// Leaves the reduction of block rank (of `blocks`, in elements) in place in `work`; the other
// blocks hold partial sums.
void ring_reduce_scatter(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                         const Bounds& blocks, std::size_t chunk_bytes, Scratch& s);
// Block b of `data` (bounds in bytes) is rank b's; each rank holds its own, and ends with all.
void ring_allgather(PeerTransport& t, std::uint8_t* data, const Bounds& blocks,
                    std::size_t chunk_bytes);
void ring_broadcast(PeerTransport& t, std::uint8_t* data, std::size_t bytes, int root,
                    std::size_t chunk_bytes);

// ---- recursive_doubling.cpp ----
// The fold around a power-of-two reduction (Fold): in, the even rank of each pair hands its
// `count` work elements over and the odd one reduces them into its own; out, the odd rank
// hands the final values back.
void fold_in_reduce(PeerTransport& t, const Fold& fold, const Reduction& r, std::uint8_t* work,
                    std::size_t count, Scratch& s);
void fold_out_result(PeerTransport& t, const Fold& fold, const Reduction& r, std::uint8_t* work,
                     std::size_t count, Scratch& s);
// A buffer as pipelined_exchange cuts it: pieces of whole units (wire elements).
struct Piecewise {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::size_t unit = 1;
};
// Sends `out` to `peer` while receiving `in`, each cut into pieces of at most piece_bytes, one
// piece each way in flight, and calls arrived(offset, bytes) for each range of `in` as soon as
// it is in (and, if overwrites_out, the same range of `out` has left, so that the caller may
// write there): the reduction of what came overlaps the kernel's moving of what comes next,
// and the bytes in flight stay in cache. The ranges come in order and cover `in` once.
void pipelined_exchange(PeerTransport& t, int peer, const Piecewise& out, const Piecewise& in,
                        std::size_t piece_bytes, bool overwrites_out,
                        const std::function<void(std::size_t, std::size_t)>& arrived);
// Rounds final values to the wire type on a narrow wire, after avg's division.
void finish_values(const Reduction& r, std::uint8_t* work, std::size_t count, Scratch& s);
// piece_bytes, here and below: the pieces each exchange is cut into (pipelined_exchange).
void recursive_doubling_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                                  std::size_t count, std::size_t piece_bytes, Scratch& s);
void recursive_doubling_allgather(PeerTransport& t, std::uint8_t* data, const Bounds& blocks,
                                  std::size_t piece_bytes);
// The power-of-two core, among the fold's new ranks: the new rank at position x (`order`)
// holds block x of `blocks` (pow2 + 1 bounds, in bytes) and ends with all of them.
void doubling_allgather_core(PeerTransport& t, const Fold& fold, Positions order,
                             std::uint8_t* data, const Bounds& blocks, std::size_t piece_bytes);

// ---- rabenseifner.cpp ----
void rabenseifner_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                            std::size_t count, std::size_t piece_bytes, Scratch& s);
// Like ring_reduce_scatter.
void recursive_halving_reduce_scatter(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                                      const Bounds& blocks, std::size_t piece_bytes, Scratch& s);

// ---- binomial_tree.cpp ----
void binomial_tree_broadcast(PeerTransport& t, std::uint8_t* data, std::size_t bytes, int root);

}  // namespace partrain::comm
