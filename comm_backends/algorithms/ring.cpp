// The ring: allreduce, reduce-scatter, allgather and a pipelined broadcast chain.
//
// Note [Ring allreduce]
// The buffer is cut into W *segments*, one per rank. In step s (0 <= s < 2(W-1)) rank r sends
// segment (r - s) mod W to its right (rank r+1) and receives segment (r - s - 1) mod W from its
// left (rank r-1):
//
//   steps 0 .. W-2   reduce-scatter: the received segment is reduced into ours, so after
//                    W-1 steps rank r holds the full reduction of segment (r + 1) mod W;
//   steps W-1 ..     allgather: the received segment (already final) replaces ours.
//
// What a rank sends in step s+1 is what it received in step s, so each segment is further
// cut into *chunks*, and chunk c of step s+1 leaves as soon as chunk c of step s has arrived
// and been reduced, not when the whole segment has. One send and one receive are in flight
// at a time, on the connections to the two neighbours, and the kernel moves bytes both ways
// while this thread reduces. Every rank moves 2(W-1)/W of the buffer each way: the
// bandwidth-optimal amount, hence busbw = algbw * 2(W-1)/W; but 2(W-1) messages in a row, so
// small messages take other algorithms (algorithm_choice.h).
//
// f16/bf16 data are widened to an f32 work copy, so sums accumulate in f32. A reduced-precision
// wire (f32 work, wire f16/bf16) halves the bytes the kernel copies; the conversions must then
// cost less than the copies they save, so every element is converted as few times as possible
// and while it is in cache. The rank keeps a wire word for every element: step 0 narrows what
// it sends into it; a reduce-scatter chunk arrives straight into it, is reduced into the work
// copy and rewritten in place as wire words of the result (reduce_from_wire(), one pass), and
// step s+1 sends those words as they are; an allgather chunk arrives into it, is widened into
// the work copy and is forwarded untouched. The owner of a segment rounds its final values to
// the wire type in that same pass, so every rank ends with the same bits. A region of the
// words is overwritten only by a later arrival of the same segment, which cannot come before
// our send of it has left: that arrival depends on it, around the ring.
//
// reduce_scatter alone is the first W-1 steps, turned so that rank r ends owning segment r;
// allgather alone the last W-1; broadcast a chain from the root around the ring, each rank
// forwarding chunk c as soon as it has it. The frame header that opens each collective on each
// connection is the transport's (Note [Peer transport]).

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm_backends/algorithms/algorithms.h"
#include "comm_backends/reduction.h"
#include "common/errors.h"

namespace partrain::comm {
namespace {

// A byte range of the pass's work buffer. In a reduction both ends fall on element
// boundaries of the work type; broadcast and allgather move bytes.
struct Segment {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

// One step: which segment leaves to the right, which arrives from the left, what to do with
// an arrival, and which step's arrivals a send waits for (chunk by chunk).
struct Step {
  int send = -1;
  int recv = -1;
  bool reduce = false;
  bool finalize = false;     // after this step's reduction the rank owns the final values
  bool narrow_send = false;  // the segment leaves from the work buffer, not from the words
  int send_after = -1;
};

// What a pass moves: the work buffer cut into segments and chunks, and the steps.
struct Pass {
  std::uint8_t* work = nullptr;
  DType work_type = DType::f32;  // reductions only
  DType wire_type = DType::f32;
  std::size_t work_elem = 1;      // bytes per element in memory
  std::size_t wire_elem = 1;      // bytes per element on the wire
  bool narrow = false;            // the wire type differs from the work type
  std::uint16_t* wire = nullptr;  // narrow: the wire words of every element
  ReduceOp op = ReduceOp::sum;
  int divisor = 1;
  std::vector<Segment> segments;
  std::vector<Step> steps;
  std::size_t chunks = 1;  // per segment

  std::size_t elements(const Segment& s) const { return s.bytes / work_elem; }
  std::uint16_t* wire_words(const Segment& s) const { return wire + s.offset / work_elem; }
  // Chunk c of a segment, cut on element boundaries.
  Segment chunk(int segment, std::size_t c) const {
    const Segment& s = segments[segment];
    const std::size_t n = elements(s);
    const std::size_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    return {s.offset + begin * work_elem, (end - begin) * work_elem};
  }
};

std::size_t chunks_per_segment(std::size_t largest_segment, std::size_t chunk) {
  return std::max<std::size_t>(1, (largest_segment + chunk - 1) / chunk);
}

int mod(int a, int w) { return ((a % w) + w) % w; }

// Step s of rank r around the ring: send segment (r - s + shift) mod W to the right, receive
// segment (r - s - 1 + shift) mod W from the left, and send only what step s - 1 has received.
Step ring_step(int rank, int world, int s, int shift) {
  Step step;
  step.send = mod(rank - s + shift, world);
  step.recv = mod(rank - s - 1 + shift, world);
  step.send_after = s - 1;
  return step;
}

std::vector<Segment> segments_of(const Bounds& bounds, std::size_t unit) {
  std::vector<Segment> segments;
  for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
    segments.push_back({bounds[i] * unit, (bounds[i + 1] - bounds[i]) * unit});
  }
  return segments;
}

std::size_t largest(const Bounds& bounds) {
  std::size_t most = 0;
  for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
    most = std::max(most, bounds[i + 1] - bounds[i]);
  }
  return most;
}

// Carries a pass out: one send to the right and one receive from the left in flight, chunk
// c of step s+1 sent once chunk c of step s has arrived (and been reduced).
class PassRun {
 public:
  PassRun(PeerTransport& t, const Pass& pass, std::uint8_t* stage)
      : t_(t), pass_(pass), stage_(stage), recv_done_(pass.steps.size(), 0) {
    send_.peer = (t.rank() + 1) % t.size();
    send_.outgoing = true;
    recv_.peer = (t.rank() + t.size() - 1) % t.size();
    skip_idle(send_step_, &Step::send);
    skip_idle(recv_step_, &Step::recv);
  }

  void run() {
    for (;;) {
      receive_what_may_arrive();
      send_what_is_ready();
      if (!send_busy_ && !recv_busy_) {
        PARTRAIN_CHECK(send_step_ >= steps() && recv_step_ >= steps(), Error,
                       "ring: a pass stalled with nothing in flight");
        return;
      }
      t_.progress();
      if (recv_busy_ && recv_.done()) {
        recv_busy_ = false;
        arrived(recv_piece_);
      }
      if (send_busy_ && send_.done()) {
        send_busy_ = false;
        next_send();
      }
    }
  }

 private:
  std::size_t steps() const { return pass_.steps.size(); }
  void skip_idle(std::size_t& step, int Step::*segment) const {
    while (step < steps() && pass_.steps[step].*segment < 0) ++step;
  }

  void receive_what_may_arrive() {
    while (!recv_busy_ && recv_step_ < steps()) {
      const Step& step = pass_.steps[recv_step_];
      const Segment piece = pass_.chunk(step.recv, recv_chunk_);
      if (piece.bytes == 0) {
        count_arrival();
        continue;
      }
      recv_.data = arrival_of(step, piece);
      recv_.bytes = pass_.elements(piece) * pass_.wire_elem;
      t_.start(recv_);
      if (recv_.done()) {
        arrived(piece);
      } else {
        recv_busy_ = true;
        recv_piece_ = piece;
      }
    }
  }

  // Where a chunk lands: in its wire words on a narrow wire; else in the stage when it is to
  // be reduced into ours, or in place when it replaces ours.
  void* arrival_of(const Step& step, const Segment& piece) const {
    if (pass_.narrow) return pass_.wire_words(piece);
    if (step.reduce) return stage_;
    return pass_.work + piece.offset;
  }

  void arrived(const Segment& piece) {
    const Step& step = pass_.steps[recv_step_];
    if (step.reduce) {
      reduce_chunk(step, piece);
    } else if (pass_.narrow) {
      widen_from_wire(pass_.wire_words(piece), reinterpret_cast<float*>(pass_.work + piece.offset),
                      pass_.wire_type, pass_.elements(piece));
    }
    count_arrival();
  }

  void reduce_chunk(const Step& step, const Segment& piece) {
    std::uint8_t* target = pass_.work + piece.offset;
    const std::size_t elements = pass_.elements(piece);
    if (pass_.narrow) {
      reduce_from_wire(reinterpret_cast<float*>(target), pass_.wire_words(piece), pass_.wire_type,
                       elements, pass_.op, step.finalize, pass_.divisor);
      return;
    }
    reduce_into(target, pass_.work_type, stage_, pass_.work_type, elements, pass_.op);
    if (step.finalize && pass_.divisor != 1) {
      divide_elements(target, pass_.work_type, elements, pass_.divisor);
    }
  }

  void count_arrival() {
    ++recv_done_[recv_step_];
    if (++recv_chunk_ < pass_.chunks) return;
    recv_chunk_ = 0;
    ++recv_step_;
    skip_idle(recv_step_, &Step::recv);
  }

  // In step order while the send side is free; on a narrow wire a chunk leaves as wire words
  // (step 0 narrows the work copy into them, later steps forward what an arrival left there).
  void send_what_is_ready() {
    while (!send_busy_ && send_step_ < steps()) {
      const Step& step = pass_.steps[send_step_];
      if (step.send_after >= 0 && recv_done_[step.send_after] <= send_chunk_) return;
      const Segment piece = pass_.chunk(step.send, send_chunk_);
      if (piece.bytes == 0) {
        next_send();
        continue;
      }
      const std::size_t elements = pass_.elements(piece);
      void* source = pass_.work + piece.offset;
      if (pass_.narrow) {
        std::uint16_t* words = pass_.wire_words(piece);
        if (step.narrow_send) {
          narrow_to_wire(static_cast<const float*>(source), words, pass_.wire_type, elements);
        }
        source = words;
      }
      send_.data = source;
      send_.bytes = elements * pass_.wire_elem;
      t_.start(send_);
      if (send_.done()) {
        next_send();
      } else {
        send_busy_ = true;
      }
    }
  }

  void next_send() {
    if (++send_chunk_ < pass_.chunks) return;
    send_chunk_ = 0;
    ++send_step_;
    skip_idle(send_step_, &Step::send);
  }

  PeerTransport& t_;
  const Pass& pass_;
  std::uint8_t* const stage_;
  PeerTransport::Transfer send_, recv_;
  Segment recv_piece_;
  std::size_t send_step_ = 0, send_chunk_ = 0, recv_step_ = 0, recv_chunk_ = 0;
  std::vector<std::size_t> recv_done_;  // per step: chunks received (and reduced)
  bool send_busy_ = false, recv_busy_ = false;
};

// A reduction pass over `work`, with its segments (element bounds) cut into chunks of at most
// chunk_bytes of work.
Pass reduction_pass(const Reduction& r, std::uint8_t* work, const Bounds& blocks,
                    std::size_t chunk_bytes, Scratch& s) {
  Pass pass;
  pass.work = work;
  pass.work_type = r.work;
  pass.wire_type = r.wire;
  pass.work_elem = r.work_elem();
  pass.wire_elem = r.wire_elem();
  pass.narrow = r.narrow();
  pass.op = r.op;
  pass.divisor = r.divisor;
  pass.segments = segments_of(blocks, pass.work_elem);
  // Sized in work-copy bytes, so what one chunk's reduction touches stays in cache whatever
  // the wire type.
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes / pass.work_elem);
  pass.chunks = chunks_per_segment(largest(blocks), chunk_elems);
  if (pass.narrow) {
    s.words.resize(std::max(s.words.size(), blocks.back()));
    pass.wire = s.words.data();
  }
  return pass;
}

void run_pass(PeerTransport& t, const Pass& pass, Scratch& s) {
  std::size_t stage = 0;
  if (!pass.narrow) {
    for (std::size_t i = 0; i < pass.segments.size(); ++i) {
      stage = std::max(stage, pass.chunk(static_cast<int>(i), 0).bytes + pass.work_elem);
    }
  }
  s.stage.resize(std::max(s.stage.size(), stage));
  PassRun(t, pass, s.stage.data()).run();
}

// W-1 reduce-scatter steps, the last of which leaves the rank owning segment (rank + 1 + shift).
void add_reduce_scatter_steps(Pass& pass, int rank, int world, int shift) {
  for (int s = 0; s < world - 1; ++s) {
    Step step = ring_step(rank, world, s, shift);
    step.reduce = true;
    step.finalize = s == world - 2;
    step.narrow_send = s == 0;
    pass.steps.push_back(step);
  }
}

}  // namespace

void ring_allreduce(PeerTransport& t, const Reduction& r, std::uint8_t* work, std::size_t count,
                    std::size_t chunk_bytes, Scratch& s) {
  const int world = t.size();
  Pass pass = reduction_pass(r, work, equal_bounds(count, world), chunk_bytes, s);
  add_reduce_scatter_steps(pass, t.rank(), world, 0);
  for (int step = world - 1; step < 2 * (world - 1); ++step) {
    pass.steps.push_back(ring_step(t.rank(), world, step, 0));
  }
  run_pass(t, pass, s);
}

void ring_reduce_scatter(PeerTransport& t, const Reduction& r, std::uint8_t* work,
                         const Bounds& blocks, std::size_t chunk_bytes, Scratch& s) {
  Pass pass = reduction_pass(r, work, blocks, chunk_bytes, s);
  // Shifted by one back, so that rank r ends owning block r.
  add_reduce_scatter_steps(pass, t.rank(), t.size(), -1);
  run_pass(t, pass, s);
}

// The allgather half of an allreduce: rank r's block starts at r and travels W-1 steps.
void ring_allgather(PeerTransport& t, std::uint8_t* data, const Bounds& blocks,
                    std::size_t chunk_bytes) {
  Pass pass;
  pass.work = data;
  pass.segments = segments_of(blocks, 1);
  pass.chunks = chunks_per_segment(largest(blocks), chunk_bytes);
  for (int step = 0; step < t.size() - 1; ++step) {
    pass.steps.push_back(ring_step(t.rank(), t.size(), step, 0));
  }
  Scratch none;
  run_pass(t, pass, none);
}

void ring_broadcast(PeerTransport& t, std::uint8_t* data, std::size_t bytes, int root,
                    std::size_t chunk_bytes) {
  const int world = t.size();
  Pass pass;
  pass.work = data;
  pass.segments = {Segment{0, bytes}};
  pass.chunks = chunks_per_segment(bytes, chunk_bytes);
  const int position = mod(t.rank() - root, world);
  Step step;
  if (position > 0) step.recv = 0;
  if (position < world - 1) step.send = 0;
  if (position > 0 && position < world - 1) step.send_after = 0;
  pass.steps.push_back(step);
  Scratch none;
  run_pass(t, pass, none);
}

}  // namespace partrain::comm
