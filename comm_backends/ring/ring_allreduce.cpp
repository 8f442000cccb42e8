#include "comm_backends/ring/ring_allreduce.h"

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
// and been reduced, not when the whole segment has. Sends and receives run on separate
// sockets (full duplex) driven by one thread with asynchronous operations, so while we reduce
// one chunk the kernel is already moving the next one in and the previous one out. Every rank
// moves 2(W-1)/W of the buffer each way: the bandwidth-optimal amount, hence
// busbw = algbw * 2(W-1)/W. On loopback each of those bytes costs two kernel copies (into the
// socket, out of it), and that is what bounds the ring on a small machine: nothing else here
// comes close (measured in bench/allreduce/RESULTS.md).
//
// f16/bf16 data are widened to an f32 work copy, so sums accumulate in f32. A reduced-precision
// wire (f32 data, wire f16/bf16) halves the bytes the kernel copies; the conversions must then
// cost less than the copies they save, so every element is converted as few times as possible
// and while it is in cache. The rank keeps a wire word for every element (wire_): step 0 narrows
// what it sends into it; a reduce-scatter chunk arrives straight into it, is reduced into the
// work copy and rewritten in place as wire words of the result (reduce_from_wire(), one pass),
// and step s+1 sends those words as they are; an allgather chunk arrives into it, is widened
// into the work copy and is forwarded untouched. The owner of a segment rounds its final values
// to the wire type in that same pass, so every rank ends with the same bits. A region of wire_
// is overwritten only by a later arrival of the same segment, which cannot come before our
// send of it has left: that arrival depends on it, around the ring.
//
// Each collective opens with a frame header (kind, sequence number, count, dtypes, op, root)
// that the receiver checks against its own call, so ranks that disagree fail with a message
// instead of mixing up bytes.
//
// In the code: plan_allreduce() cuts the segments and chunks and lays out the steps
// (allreduce_steps(); an allgather alone takes the last W-1 of them, broadcast a chain from the
// root). PassRun carries a plan out: post_headers() opens it; send_ready_chunks() sends chunk
// c of step s+1 as soon as on_chunk_arrived() has taken chunk c of step s, reduced into ours
// (reduce_chunk()) or, in the allgather steps, in place of ours; wait() bounds the whole pass
// by the timeout, and finish() hands the buffers back or throws naming the failed neighbour.

#include <algorithm>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <memory>
#include <utility>

#include "comm_backends/collective_call.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/reduction.h"
#include "common/byte_codec.h"
#include "common/errors.h"

namespace partrain::comm {

namespace asio = boost::asio;
using boost::system::error_code;
using net::Clock;

namespace {

using Kind = CollectiveKind;
constexpr std::uint32_t kFrameMagic = 0x46435450;  // "PTCF"
constexpr std::size_t kHeaderBytes = kRingFrameHeaderBytes;

// A byte range of the pass's work buffer. In an allreduce both ends fall on element
// boundaries of the work type (Pass::elements() converts); broadcast and allgather move bytes.
struct Segment {
  std::size_t offset = 0;  // bytes from the start of the work buffer
  std::size_t bytes = 0;
};

// One step of a pass: which segment leaves to the right, which arrives from the left, what
// to do with an arrival, and which step's arrivals a send waits for (chunk by chunk).
struct Step {
  int send = -1;
  int recv = -1;
  bool reduce = false;
  bool finalize = false;     // after this step's reduction the rank owns the final values
  bool narrow_send = false;  // the segment leaves from the work buffer, not from the wire copy
  int send_after = -1;
};

// `elements` elements of `elem_bytes` each, cut into `parts` segments that differ by at most
// one element.
std::vector<Segment> equal_segments(std::size_t elements, std::size_t elem_bytes, int parts) {
  std::vector<Segment> segments(parts);
  for (int i = 0; i < parts; ++i) {
    const std::size_t first = elements * i / parts;
    const std::size_t end = elements * (i + 1) / parts;
    segments[i] = {first * elem_bytes, (end - first) * elem_bytes};
  }
  return segments;
}

// Chunks per segment: enough that none of the largest segment's chunks exceeds `chunk` units
// (elements or bytes, as the segment is counted), and at least one.
std::size_t chunks_per_segment(std::size_t largest_segment, std::size_t chunk) {
  return std::max<std::size_t>(1, (largest_segment + chunk - 1) / chunk);
}

// Step s of rank r around the ring: send segment (r - s) mod W to the right, receive segment
// (r - s - 1) mod W from the left, and send only what step s - 1 has received.
Step ring_step(int rank, int world, int s) {
  Step step;
  step.send = ((rank - s) % world + world) % world;
  step.recv = ((rank - s - 1) % world + world) % world;
  step.send_after = s - 1;
  return step;
}

// The steps of an allreduce: W-1 reduce-scatter steps (the last of them leaves this rank
// owning one segment's final values), then W-1 allgather steps.
std::vector<Step> allreduce_steps(int rank, int world) {
  std::vector<Step> steps;
  for (int s = 0; s < 2 * (world - 1); ++s) {
    Step step = ring_step(rank, world, s);
    step.reduce = s < world - 1;
    step.finalize = s == world - 2;
    step.narrow_send = s == 0;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace

// A frame header is a CollectiveCall in a fixed little-endian layout behind the magic.
struct RingCollectives::Header : CollectiveCall {
  void encode(std::uint8_t* out) const {
    std::memset(out, 0, kHeaderBytes);
    put_le<std::uint32_t>(out, kFrameMagic);
    out[4] = kind;
    out[5] = dtype;
    out[6] = wire;
    out[7] = op;
    put_le(out + 8, static_cast<std::uint32_t>(root));
    put_le(out + 12, sequence);
    put_le(out + 20, counts_elements() ? elements : bytes);
  }
};

std::string RingCollectives::describe_frame(const std::uint8_t* header) {
  const bool framed = header[0] == 'P' && header[1] == 'T' && header[2] == 'C' && header[3] == 'F';
  if (!framed) return "something unrecognisable";
  Header theirs;
  theirs.kind = header[4];
  theirs.dtype = header[5];
  theirs.wire = header[6];
  theirs.op = header[7];
  theirs.root = static_cast<std::int32_t>(get_le<std::uint32_t>(header + 8));
  theirs.sequence = get_le<std::uint64_t>(header + 12);
  (theirs.counts_elements() ? theirs.elements : theirs.bytes) = get_le<std::uint64_t>(header + 20);
  return theirs.describe();
}

// What a pass moves: the work buffer cut into segments and chunks, and the steps.
struct RingCollectives::Pass {
  std::uint8_t* work = nullptr;
  DType work_type = DType::f32;
  DType wire_type = DType::f32;
  std::size_t work_elem = 1;      // bytes per element in memory
  std::size_t wire_elem = 1;      // bytes per element on the wire
  bool narrow = false;            // the wire type differs from the work type
  std::uint16_t* wire = nullptr;  // narrow: the wire words of every element, see allreduce()
  ReduceOp op = ReduceOp::sum;
  int divisor = 1;  // avg: the world size, applied by the owner of each final value
  std::vector<Segment> segments;
  std::vector<Step> steps;
  std::size_t chunks = 1;  // per segment

  std::size_t elements(const Segment& s) const { return s.bytes / work_elem; }
  std::size_t first_element(const Segment& s) const { return s.offset / work_elem; }
  // narrow: the wire words of a segment's elements.
  std::uint16_t* wire_words(const Segment& s) const { return wire + first_element(s); }

  // Chunk c of a segment, cut on element boundaries.
  Segment chunk(int segment, std::size_t c) const {
    const Segment& s = segments[segment];
    const std::size_t n = elements(s);
    const std::size_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    return {s.offset + begin * work_elem, (end - begin) * work_elem};
  }
};

// One pass on the wire, as Note [Ring allreduce] tells it. One operation per direction is in
// flight at a time; send_ready_chunks() and receive_next_chunk() start the next one whenever
// a direction is free and the pipeline allows it.
//
// The pass lives on the heap, shared by every completion handler it starts: a handler that
// runs after run_pass() has returned (a pass abandoned after a failure, whose aborted handlers
// the io_context runs later or never) still finds it. finish() disarms it, and from then on a
// handler only records that its operation is over: the buffers and the ring belong to the
// caller again.
class RingCollectives::PassRun : public std::enable_shared_from_this<PassRun> {
 public:
  PassRun(RingTransport& transport, Pass pass, const Header& header, std::uint8_t* recv_stage)
      : transport_(transport), pass_(std::move(pass)), header_(header), recv_stage_(recv_stage) {
    header_.encode(my_header_);
    recv_done_.assign(pass_.steps.size(), 0);
    skip_idle_steps(send_step_, &Step::send);
    skip_idle_steps(recv_step_, &Step::recv);
  }

  void post_headers();
  void wait(std::chrono::milliseconds timeout);
  void finish();

 private:
  std::size_t step_count() const { return pass_.steps.size(); }
  void skip_idle_steps(std::size_t& step, int Step::*segment) const {
    while (step < step_count() && pass_.steps[step].*segment < 0) ++step;
  }
  bool done() const {
    return send_step_ >= step_count() && recv_step_ >= step_count() && !send_busy_ && !recv_busy_;
  }

  void on_header_sent(const error_code& ec);
  void on_left_header(const error_code& ec);
  void send_ready_chunks();
  void send_chunk(const Step& step, const Segment& piece);
  void on_chunk_sent(const error_code& ec);
  void next_send();
  void receive_next_chunk();
  void* arrival_of(const Step& step, const Segment& piece) const;
  void on_chunk_arrived(const error_code& ec, const Segment& piece);
  void reduce_chunk(const Step& step, const Segment& piece);
  void count_arrival();
  void fail(int peer, bool is_peer, const std::string& message);
  void fail_io(int peer, const error_code& ec, const char* direction);

  RingTransport& transport_;
  const Pass pass_;
  const Header header_;
  std::uint8_t* const recv_stage_;  // not narrow: a chunk to reduce arrives here first
  std::uint8_t my_header_[kHeaderBytes] = {};
  std::uint8_t left_header_[kHeaderBytes] = {};
  std::size_t send_step_ = 0, send_chunk_ = 0, recv_step_ = 0, recv_chunk_ = 0;
  std::vector<std::size_t> recv_done_;        // per step: chunks received (and reduced)
  bool send_busy_ = true, recv_busy_ = true;  // the headers go first
  bool armed_ = true;                         // false once finish() has handed everything back
  int failed_peer_ = -1;
  bool peer_failure_ = false;
  std::string failure_;
};

// Each collective opens with a frame header, checked against our own call before any of the
// neighbour's data is taken.
void RingCollectives::PassRun::post_headers() {
  asio::async_write(
      transport_.to_right(), asio::buffer(my_header_, kHeaderBytes),
      [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_header_sent(ec); });
  asio::async_read(
      transport_.from_left(), asio::buffer(left_header_, kHeaderBytes),
      [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_left_header(ec); });
}

void RingCollectives::PassRun::on_header_sent(const error_code& ec) {
  send_busy_ = false;
  if (!armed_) return;
  if (ec) return fail_io(transport_.right(), ec, "sending to it");
  send_ready_chunks();
}

void RingCollectives::PassRun::on_left_header(const error_code& ec) {
  recv_busy_ = false;
  if (!armed_) return;
  const int left = transport_.left();
  if (ec) return fail_io(left, ec, "receiving from it");
  if (std::memcmp(left_header_, my_header_, kHeaderBytes) != 0) {
    return fail(left, false,
                "asio-ring: ranks disagree: rank " + std::to_string(left) + " called " +
                    describe_frame(left_header_) + " while rank " +
                    std::to_string(transport_.rank()) + " called " + header_.describe());
  }
  receive_next_chunk();
}

// Sends chunks in step order while the socket is free. Chunk c of step s+1 is what arrived as
// chunk c of step s, so it leaves only once that arrival is in (and reduced).
void RingCollectives::PassRun::send_ready_chunks() {
  while (!send_busy_ && failure_.empty() && send_step_ < step_count()) {
    const Step& step = pass_.steps[send_step_];
    if (step.send_after >= 0 && recv_done_[step.send_after] <= send_chunk_) return;
    const Segment piece = pass_.chunk(step.send, send_chunk_);
    if (piece.bytes == 0) {
      next_send();
      continue;
    }
    send_chunk(step, piece);
  }
}

// On a reduced-precision wire a chunk leaves as wire words: step 0 narrows the work copy into
// them; later steps forward the words an arrival left there.
void RingCollectives::PassRun::send_chunk(const Step& step, const Segment& piece) {
  const std::size_t elements = pass_.elements(piece);
  const void* source = pass_.work + piece.offset;
  if (pass_.narrow) {
    std::uint16_t* words = pass_.wire_words(piece);
    if (step.narrow_send) {
      narrow_to_wire(static_cast<const float*>(source), words, pass_.wire_type, elements);
    }
    source = words;
  }
  send_busy_ = true;
  asio::async_write(
      transport_.to_right(), asio::buffer(source, elements * pass_.wire_elem),
      [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_chunk_sent(ec); });
}

void RingCollectives::PassRun::on_chunk_sent(const error_code& ec) {
  send_busy_ = false;
  if (!armed_) return;
  if (ec) return fail_io(transport_.right(), ec, "sending to it");
  next_send();
  send_ready_chunks();
}

void RingCollectives::PassRun::next_send() {
  if (++send_chunk_ < pass_.chunks) return;
  send_chunk_ = 0;
  ++send_step_;
  skip_idle_steps(send_step_, &Step::send);
}

// Posts the read of the next chunk to arrive, then lets the sends catch up with what has.
void RingCollectives::PassRun::receive_next_chunk() {
  while (!recv_busy_ && failure_.empty() && recv_step_ < step_count()) {
    const Step& step = pass_.steps[recv_step_];
    const Segment piece = pass_.chunk(step.recv, recv_chunk_);
    if (piece.bytes == 0) {
      count_arrival();
      continue;
    }
    recv_busy_ = true;
    asio::async_read(transport_.from_left(),
                     asio::buffer(arrival_of(step, piece), pass_.elements(piece) * pass_.wire_elem),
                     [self = shared_from_this(), piece](const error_code& ec, std::size_t) {
                       self->on_chunk_arrived(ec, piece);
                     });
  }
  send_ready_chunks();
}

// Where a chunk lands: in its wire words on a reduced-precision wire; else in the receive
// stage when it is to be reduced into ours, or in place when it replaces ours (allgather).
void* RingCollectives::PassRun::arrival_of(const Step& step, const Segment& piece) const {
  if (pass_.narrow) return pass_.wire_words(piece);
  if (step.reduce) return recv_stage_;
  return pass_.work + piece.offset;
}

// A reduce-scatter chunk is reduced into ours; an allgather chunk (already final) is widened
// into the work copy from its wire words, or has already landed in place.
void RingCollectives::PassRun::on_chunk_arrived(const error_code& ec, const Segment& piece) {
  recv_busy_ = false;
  if (!armed_) return;
  if (ec) return fail_io(transport_.left(), ec, "receiving from it");
  const Step& step = pass_.steps[recv_step_];
  if (step.reduce) {
    reduce_chunk(step, piece);
  } else if (pass_.narrow) {
    widen_from_wire(pass_.wire_words(piece), reinterpret_cast<float*>(pass_.work + piece.offset),
                    pass_.wire_type, pass_.elements(piece));
  }
  count_arrival();
  receive_next_chunk();
  send_ready_chunks();
}

// On a reduced-precision wire the words are reduced and rewritten in place, ready to forward
// (reduce_from_wire()); the owner of the final values applies avg's division either way.
void RingCollectives::PassRun::reduce_chunk(const Step& step, const Segment& piece) {
  std::uint8_t* target = pass_.work + piece.offset;
  const std::size_t elements = pass_.elements(piece);
  if (pass_.narrow) {
    reduce_from_wire(reinterpret_cast<float*>(target), pass_.wire_words(piece), pass_.wire_type,
                     elements, pass_.op, step.finalize, pass_.divisor);
    return;
  }
  reduce_into(target, pass_.work_type, recv_stage_, pass_.work_type, elements, pass_.op);
  if (step.finalize && pass_.divisor != 1) {
    divide_elements(target, pass_.work_type, elements, pass_.divisor);
  }
}

void RingCollectives::PassRun::count_arrival() {
  ++recv_done_[recv_step_];
  if (++recv_chunk_ < pass_.chunks) return;
  recv_chunk_ = 0;
  ++recv_step_;
  skip_idle_steps(recv_step_, &Step::recv);
}

// The first failure wins; breaking the ring aborts the other direction's pending operation.
void RingCollectives::PassRun::fail(int peer, bool is_peer, const std::string& message) {
  if (!failure_.empty()) return;
  failed_peer_ = peer;
  peer_failure_ = is_peer;
  failure_ = message;
  transport_.break_ring();
}

void RingCollectives::PassRun::fail_io(int peer, const error_code& ec, const char* direction) {
  const bool closed = ec == asio::error::eof || ec == asio::error::connection_reset ||
                      ec == asio::error::broken_pipe;
  fail(peer, true,
       "asio-ring: rank " + std::to_string(peer) +
           (closed ? " closed its connection (it exited or failed)" : " connection failed") +
           " while " + direction + " during " + header_.describe() + ": " + ec.message());
}

// Drives the ring until the last chunk has gone both ways or something failed. A neighbour
// that lets the bound pass is named: the left one if we still wait for data, else the right.
void RingCollectives::PassRun::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const bool finished = net::run_until(
      transport_.io(), [this] { return !failure_.empty() || done(); }, deadline);
  if (finished) return;
  const bool waiting_left = recv_busy_ || recv_step_ < step_count();
  const int peer = waiting_left ? transport_.left() : transport_.right();
  fail(peer, true,
       "asio-ring: rank " + std::to_string(peer) +
           (waiting_left ? " sent nothing for " : " stopped taking our data for ") +
           std::to_string(timeout.count()) + " ms during " + header_.describe() +
           " (dead, hung, or not calling the same collective)");
}

// Ends the pass: disarms the handlers and throws what failed, if anything did.
void RingCollectives::PassRun::finish() {
  if (!failure_.empty()) {
    // The sockets are closed, so the aborted operations complete at once; give their handlers
    // a bounded moment to run. Any that have not run by then find the pass disarmed when they do.
    constexpr auto kDrainBound = std::chrono::seconds(5);
    net::run_until(
        transport_.io(), [this] { return !send_busy_ && !recv_busy_; }, Clock::now() + kDrainBound);
  }
  armed_ = false;
  if (failure_.empty()) return;
  if (peer_failure_) throw PeerError(failed_peer_, failure_);
  throw CommError(failure_);
}

RingCollectives::RingCollectives(RingTransport& transport, std::chrono::milliseconds timeout,
                                 std::size_t chunk_bytes)
    : transport_(transport),
      timeout_(timeout),
      chunk_bytes_(std::max<std::size_t>(chunk_bytes, 64)) {}

void RingCollectives::run_pass(Pass pass, const Header& header) {
  std::uint8_t* const stage = receive_stage(pass);
  const auto run = std::make_shared<PassRun>(transport_, std::move(pass), header, stage);
  run->post_headers();
  run->wait(timeout_);
  run->finish();
}

// Room for the largest chunk a reduction receives before reducing it into ours (only the
// full-width wire needs it: a reduced-precision chunk arrives in its wire words).
std::uint8_t* RingCollectives::receive_stage(const Pass& pass) {
  std::size_t max_chunk = 0;
  for (std::size_t s = 0; s < pass.segments.size(); ++s) {
    max_chunk = std::max(max_chunk, pass.chunk(static_cast<int>(s), 0).bytes + pass.work_elem);
  }
  if (!pass.narrow) recv_stage_.resize(std::max(recv_stage_.size(), max_chunk));
  return recv_stage_.data();
}

void RingCollectives::check_usable() const {
  PARTRAIN_CHECK(!transport_.broken(), CommError,
                 "asio-ring: the ring is broken by an earlier failure; create a new communicator");
}

void RingCollectives::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                DType wire) {
  check_usable();
  const int world = transport_.size();
  if (world == 1) return;
  PARTRAIN_CHECK(count == 0 || data != nullptr, UsageError, "allreduce: null buffer");
  const DType acc = accumulator_type(dtype);
  if (acc != DType::f32 || (wire != DType::f16 && wire != DType::bf16)) wire = acc;

  Pass pass = plan_allreduce(count, acc, wire, op);
  if (acc != dtype) {
    work_.resize(count * pass.work_elem);
    convert_elements(data, dtype, work_.data(), acc, count);
    pass.work = work_.data();
  } else {
    pass.work = static_cast<std::uint8_t*>(data);
  }
  if (pass.narrow) {
    wire_.resize(count);
    pass.wire = wire_.data();
  }
  Header header;
  header.kind = static_cast<std::uint8_t>(Kind::allreduce);
  header.dtype = static_cast<std::uint8_t>(dtype);
  header.wire = static_cast<std::uint8_t>(wire);
  header.op = static_cast<std::uint8_t>(op);
  header.sequence = ++sequence_;
  header.elements = count;
  run_pass(std::move(pass), header);
  if (acc != dtype) convert_elements(work_.data(), acc, data, dtype, count);
}

// An allreduce's segments, chunks and steps; the caller points it at the work copy.
RingCollectives::Pass RingCollectives::plan_allreduce(std::size_t count, DType acc, DType wire,
                                                      ReduceOp op) const {
  const int world = transport_.size();
  Pass pass;
  pass.work_type = acc;
  pass.wire_type = wire;
  pass.work_elem = dtype_size(acc);
  pass.wire_elem = dtype_size(wire);
  pass.narrow = acc != wire;
  pass.op = op;
  if (op == ReduceOp::avg) pass.divisor = world;
  pass.segments = equal_segments(count, pass.work_elem, world);
  // Sized in work-copy bytes, so what one chunk's reduction touches stays in cache whatever
  // the wire type.
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes_ / pass.work_elem);
  pass.chunks = chunks_per_segment((count + world - 1) / world, chunk_elems);
  pass.steps = allreduce_steps(transport_.rank(), world);
  return pass;
}

void RingCollectives::broadcast(void* data, std::size_t bytes, int root) {
  check_usable();
  const int world = transport_.size();
  PARTRAIN_CHECK(root >= 0 && root < world, UsageError, "broadcast: root ", root,
                 " is outside a world of ", world);
  if (world == 1) return;
  // A chain from the root around the ring; each rank forwards chunk c as soon as it has it.
  Pass pass;
  pass.work = static_cast<std::uint8_t*>(data);
  pass.segments = {Segment{0, bytes}};
  pass.chunks = chunks_per_segment(bytes, chunk_bytes_);
  const int position = (transport_.rank() - root + world) % world;
  Step step;
  if (position > 0) step.recv = 0;
  if (position < world - 1) step.send = 0;
  if (position > 0 && position < world - 1) step.send_after = 0;
  pass.steps.push_back(step);
  Header header;
  header.kind = static_cast<std::uint8_t>(Kind::broadcast);
  header.root = root;
  header.sequence = ++sequence_;
  header.bytes = bytes;
  run_pass(std::move(pass), header);
}

// The allgather half of an allreduce: rank r's block starts at r and travels W-1 steps.
void RingCollectives::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  check_usable();
  const int world = transport_.size();
  const int r = transport_.rank();
  auto* target = static_cast<std::uint8_t*>(out);
  if (bytes_per_rank > 0 && target + r * bytes_per_rank != in) {
    std::memmove(target + r * bytes_per_rank, in, bytes_per_rank);
  }
  if (world == 1) return;
  Pass pass;
  pass.work = target;
  for (int i = 0; i < world; ++i) pass.segments.push_back({i * bytes_per_rank, bytes_per_rank});
  pass.chunks = chunks_per_segment(bytes_per_rank, chunk_bytes_);
  for (int s = 0; s < world - 1; ++s) pass.steps.push_back(ring_step(r, world, s));
  Header header;
  header.kind = static_cast<std::uint8_t>(Kind::allgather);
  header.sequence = ++sequence_;
  header.bytes = bytes_per_rank;
  run_pass(std::move(pass), header);
}

void RingCollectives::barrier() {
  // An allreduce of one value: nobody leaves before every rank's contribution went around.
  std::int32_t token = 1;
  allreduce(&token, 1, DType::i32, ReduceOp::sum, DType::i32);
  PARTRAIN_CHECK(token == transport_.size(), CommError, "asio-ring: barrier counted ", token,
                 " ranks in a world of ", transport_.size());
}

}  // namespace partrain::comm
