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

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "comm_backends/collective_call.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/reduction.h"
#include "common/byte_codec.h"
#include "common/errors.h"

namespace partrain::comm {

namespace asio = boost::asio;
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

  // Chunk c of a segment, cut on element boundaries.
  Segment chunk(int segment, std::size_t c) const {
    const Segment& s = segments[segment];
    const std::size_t n = elements(s);
    const std::size_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    return {s.offset + begin * work_elem, (end - begin) * work_elem};
  }
};

RingCollectives::RingCollectives(RingTransport& transport, std::chrono::milliseconds timeout,
                                 std::size_t chunk_bytes)
    : transport_(transport),
      timeout_(timeout),
      chunk_bytes_(std::max<std::size_t>(chunk_bytes, 64)) {}

// The state of one pass lives on the heap, shared by every completion handler it starts: a
// handler that runs after run_pass() has returned (a pass abandoned after a failure, whose
// aborted handlers the io_context runs later or never) still finds what it refers to.
struct RingCollectives::PassRun {
  PassRun(Pass p, const Header& h) : pass(std::move(p)), header(h) {}
  Pass pass;
  Header header;
  std::uint8_t my_header[kHeaderBytes] = {};
  std::uint8_t left_header[kHeaderBytes] = {};
  std::size_t send_step = 0, send_chunk = 0, recv_step = 0, recv_chunk = 0;
  std::vector<std::size_t> recv_done;       // per step: chunks received (and reduced)
  bool send_busy = true, recv_busy = true;  // the headers go first
  int failed_peer = -1;
  bool peer_failure = false;
  std::string failure;
};

void RingCollectives::run_pass(Pass pass_in, const Header& header_in) {
  const auto run = std::make_shared<PassRun>(std::move(pass_in), header_in);
  PassRun& st = *run;
  const Pass& pass = st.pass;
  const Header& header = st.header;
  const int left = transport_.left();
  const int right = transport_.right();
  auto& out = transport_.to_right();
  auto& in = transport_.from_left();
  const std::size_t n = pass.steps.size();
  std::uint8_t* const recv_stage = [&] {
    std::size_t max_chunk = 0;
    for (std::size_t s = 0; s < pass.segments.size(); ++s) {
      max_chunk = std::max(max_chunk, pass.chunk(static_cast<int>(s), 0).bytes + pass.work_elem);
    }
    if (!pass.narrow) recv_stage_.resize(std::max(recv_stage_.size(), max_chunk));
    return recv_stage_.data();
  }();

  header.encode(st.my_header);
  st.recv_done.assign(n, 0);
  while (st.send_step < n && pass.steps[st.send_step].send < 0) ++st.send_step;
  while (st.recv_step < n && pass.steps[st.recv_step].recv < 0) ++st.recv_step;

  // The helpers below are called only from this thread while it drives the io_context inside
  // this function; completion handlers hold `run` and reach the helpers through `ops`, which
  // run_pass() empties before it returns, so a late handler sees nothing to call.
  struct Ops {
    std::function<void(int, bool, const std::string&)> fail;
    std::function<void(int, const boost::system::error_code&, const char*)> io_failure;
    std::function<void()> pump_send, pump_recv;
  };
  const auto ops = std::make_shared<Ops>();

  ops->fail = [this, &st](int peer, bool is_peer, const std::string& message) {
    if (!st.failure.empty()) return;
    st.failed_peer = peer;
    st.peer_failure = is_peer;
    st.failure = message;
    transport_.break_ring();  // aborts the other direction's pending operation
  };
  ops->io_failure = [&st, ops](int peer, const boost::system::error_code& ec,
                               const char* direction) {
    const bool closed = ec == asio::error::eof || ec == asio::error::connection_reset ||
                        ec == asio::error::broken_pipe;
    ops->fail(peer, true,
              "asio-ring: rank " + std::to_string(peer) +
                  (closed ? " closed its connection (it exited or failed)" : " connection failed") +
                  " while " + direction + " during " + st.header.describe() + ": " + ec.message());
  };
  auto advance_send = [&st, n] {
    if (++st.send_chunk < st.pass.chunks) return;
    st.send_chunk = 0;
    do ++st.send_step;
    while (st.send_step < n && st.pass.steps[st.send_step].send < 0);
  };
  auto advance_recv = [&st, n] {
    if (++st.recv_chunk < st.pass.chunks) return;
    st.recv_chunk = 0;
    do ++st.recv_step;
    while (st.recv_step < n && st.pass.steps[st.recv_step].recv < 0);
  };
  auto complete_recv = [&st, advance_recv] {
    ++st.recv_done[st.recv_step];
    advance_recv();
  };

  // A completion handler: keeps the pass state alive, and does nothing once run_pass() has
  // returned (ops emptied) but record that its operation is over.
  auto on_send = [run, ops, right, advance_send](const boost::system::error_code& ec, std::size_t) {
    run->send_busy = false;
    if (!ops->pump_send) return;
    if (ec) return ops->io_failure(right, ec, "sending to it");
    advance_send();
    ops->pump_send();
  };

  ops->pump_send = [&st, &out, n, advance_send, on_send] {
    const Pass& pass = st.pass;
    while (!st.send_busy && st.failure.empty() && st.send_step < n) {
      const Step& step = pass.steps[st.send_step];
      if (step.send_after >= 0 && st.recv_done[step.send_after] <= st.send_chunk) return;
      const Segment piece = pass.chunk(step.send, st.send_chunk);
      if (piece.bytes == 0) {
        advance_send();
        continue;
      }
      const std::size_t elements = pass.elements(piece);
      const void* source = pass.work + piece.offset;
      if (pass.narrow) {
        std::uint16_t* words = pass.wire + pass.first_element(piece);
        if (step.narrow_send) {
          narrow_to_wire(static_cast<const float*>(source), words, pass.wire_type, elements);
        }
        source = words;
      }
      st.send_busy = true;
      asio::async_write(out, asio::buffer(source, elements * pass.wire_elem), on_send);
    }
  };

  ops->pump_recv = [run, ops, &st, &in, n, left, recv_stage, complete_recv] {
    const Pass& pass = st.pass;
    while (!st.recv_busy && st.failure.empty() && st.recv_step < n) {
      const Step& step = pass.steps[st.recv_step];
      const Segment piece = pass.chunk(step.recv, st.recv_chunk);
      if (piece.bytes == 0) {
        complete_recv();
        continue;
      }
      const std::size_t elements = pass.elements(piece);
      std::uint8_t* target = pass.work + piece.offset;
      void* arrival = pass.narrow   ? static_cast<void*>(pass.wire + pass.first_element(piece))
                      : step.reduce ? recv_stage
                                    : target;
      st.recv_busy = true;
      asio::async_read(in, asio::buffer(arrival, elements * pass.wire_elem),
                       [run, ops, left, recv_stage, complete_recv, piece, elements, target](
                           const boost::system::error_code& ec, std::size_t) {
                         run->recv_busy = false;
                         if (!ops->pump_recv) return;
                         if (ec) return ops->io_failure(left, ec, "receiving from it");
                         const Pass& pass = run->pass;
                         const Step& done = pass.steps[run->recv_step];
                         if (pass.narrow) {
                           auto* acc = reinterpret_cast<float*>(target);
                           std::uint16_t* words = pass.wire + pass.first_element(piece);
                           if (done.reduce) {
                             reduce_from_wire(acc, words, pass.wire_type, elements, pass.op,
                                              done.finalize, pass.divisor);
                           } else {
                             widen_from_wire(words, acc, pass.wire_type, elements);
                           }
                         } else if (done.reduce) {
                           reduce_into(target, pass.work_type, recv_stage, pass.work_type, elements,
                                       pass.op);
                           if (done.finalize && pass.divisor != 1) {
                             divide_elements(target, pass.work_type, elements, pass.divisor);
                           }
                         }
                         complete_recv();
                         ops->pump_recv();
                         ops->pump_send();
                       });
    }
    ops->pump_send();
  };

  asio::async_write(out, asio::buffer(st.my_header, kHeaderBytes),
                    [run, ops, right](const boost::system::error_code& ec, std::size_t) {
                      run->send_busy = false;
                      if (!ops->pump_send) return;
                      if (ec) return ops->io_failure(right, ec, "sending to it");
                      ops->pump_send();
                    });
  asio::async_read(in, asio::buffer(st.left_header, kHeaderBytes),
                   [this, run, ops, left](const boost::system::error_code& ec, std::size_t) {
                     run->recv_busy = false;
                     if (!ops->pump_recv) return;
                     if (ec) return ops->io_failure(left, ec, "receiving from it");
                     if (std::memcmp(run->left_header, run->my_header, kHeaderBytes) != 0) {
                       return ops->fail(left, false,
                                        "asio-ring: ranks disagree: rank " + std::to_string(left) +
                                            " called " + describe_frame(run->left_header) +
                                            " while rank " + std::to_string(transport_.rank()) +
                                            " called " + run->header.describe());
                     }
                     ops->pump_recv();
                   });

  const auto deadline = Clock::now() + timeout_;
  const bool finished = net::run_until(
      transport_.io(),
      [&st, n] {
        return !st.failure.empty() ||
               (st.send_step >= n && st.recv_step >= n && !st.send_busy && !st.recv_busy);
      },
      deadline);
  if (!finished) {
    const bool waiting_left = st.recv_busy || st.recv_step < n;
    const int peer = waiting_left ? left : right;
    ops->fail(peer, true,
              "asio-ring: rank " + std::to_string(peer) +
                  (waiting_left ? " sent nothing for " : " stopped taking our data for ") +
                  std::to_string(timeout_.count()) + " ms during " + header.describe() +
                  " (dead, hung, or not calling the same collective)");
  }
  if (!st.failure.empty()) {
    // The sockets are closed, so the aborted operations complete at once; give their handlers
    // a bounded moment to run. Any that have not run by then find `ops` empty when they do.
    constexpr auto kDrainBound = std::chrono::seconds(5);
    net::run_until(
        transport_.io(), [&st] { return !st.send_busy && !st.recv_busy; },
        Clock::now() + kDrainBound);
  }
  const std::string failure = st.failure;
  const int failed_peer = st.failed_peer;
  const bool peer_failure = st.peer_failure;
  // Break the cycles (handlers hold ops, ops' functions hold handlers) and disarm late
  // handlers: from here on they only clear their busy flag.
  ops->pump_send = nullptr;
  ops->pump_recv = nullptr;
  ops->fail = nullptr;
  ops->io_failure = nullptr;
  if (!failure.empty()) {
    if (peer_failure) throw PeerError(failed_peer, failure);
    throw CommError(failure);
  }
}

void RingCollectives::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                DType wire) {
  PARTRAIN_CHECK(!transport_.broken(), CommError,
                 "asio-ring: the ring is broken by an earlier failure; create a new communicator");
  const int world = transport_.size();
  if (world == 1) return;
  PARTRAIN_CHECK(count == 0 || data != nullptr, UsageError, "allreduce: null buffer");
  const DType acc = accumulator_type(dtype);
  if (acc != DType::f32 || (wire != DType::f16 && wire != DType::bf16)) wire = acc;

  Pass pass;
  pass.work_type = acc;
  pass.wire_type = wire;
  pass.work_elem = dtype_size(acc);
  pass.wire_elem = dtype_size(wire);
  pass.narrow = acc != wire;
  pass.op = op;
  if (op == ReduceOp::avg) pass.divisor = world;
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
  pass.segments = equal_segments(count, pass.work_elem, world);
  // Sized in work-copy bytes, so what one chunk's reduction touches stays in cache whatever
  // the wire type.
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes_ / pass.work_elem);
  const std::size_t max_segment = (count + world - 1) / world;
  pass.chunks = std::max<std::size_t>(1, (max_segment + chunk_elems - 1) / chunk_elems);
  const int r = transport_.rank();
  for (int s = 0; s < 2 * (world - 1); ++s) {
    Step step;
    step.send = ((r - s) % world + world) % world;
    step.recv = ((r - s - 1) % world + world) % world;
    step.reduce = s < world - 1;
    step.finalize = s == world - 2;
    step.narrow_send = s == 0;
    step.send_after = s - 1;
    pass.steps.push_back(step);
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

void RingCollectives::broadcast(void* data, std::size_t bytes, int root) {
  PARTRAIN_CHECK(!transport_.broken(), CommError,
                 "asio-ring: the ring is broken by an earlier failure; create a new communicator");
  const int world = transport_.size();
  PARTRAIN_CHECK(root >= 0 && root < world, UsageError, "broadcast: root ", root,
                 " is outside a world of ", world);
  if (world == 1) return;
  // A chain from the root around the ring; each rank forwards chunk c as soon as it has it.
  Pass pass;
  pass.work = static_cast<std::uint8_t*>(data);
  pass.segments = {Segment{0, bytes}};
  pass.chunks = std::max<std::size_t>(1, (bytes + chunk_bytes_ - 1) / chunk_bytes_);
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

void RingCollectives::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  PARTRAIN_CHECK(!transport_.broken(), CommError,
                 "asio-ring: the ring is broken by an earlier failure; create a new communicator");
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
  pass.chunks = std::max<std::size_t>(1, (bytes_per_rank + chunk_bytes_ - 1) / chunk_bytes_);
  for (int s = 0; s < world - 1; ++s) {
    Step step;
    step.send = ((r - s) % world + world) % world;
    step.recv = ((r - s - 1) % world + world) % world;
    step.send_after = s - 1;
    pass.steps.push_back(step);
  }
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
