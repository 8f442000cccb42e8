#include "comm_backends/shm/shm_collectives.h"

// Note [Shared-memory collectives]
// Ranks of one host map the same region:
//
//   [header | one control block per rank | half 0: W slots + words | half 1: same | stream]
//
// A *slot* holds one rank's piece of data (kShmSlotBytes); *words* holds the wire words of a
// piece when the wire is narrower than the data. Every collective runs in pieces of at most
// a slot, each on the other half than the piece before (but the broadcast's stream, Note
// [The broadcast as a stream]), and ranks meet at *syncs*: each rank
// counts the syncs it has entered and publishes the count in its control block; a sync ends
// when every rank's count has reached it.
//
//   allreduce piece:  write my data but my share into my slot -> sync -> reduce my share
//                     from the others' slots and my own buffer into my slot and my buffer
//                     -> sync -> read the others' shares from their slots
//   reduce_scatter piece:  write the others' blocks of it into my slot -> sync -> reduce my
//                     block from their slots and my own input into my output
//   broadcast:        the root writes pieces into the stream area, the others read each as
//                     soon as it is there (Note [The broadcast as a stream])
//   allgather piece:  write my slot (and, unless in place, my block of the output) -> sync ->
//                     read the others'
//   allgather, single copy (blocks from kSingleCopyBytes, Note [Reading another rank's
//                     memory]):  publish where my input is (and copy my block of the output)
//                     -> sync -> read each other rank's input straight from its process ->
//                     sync
//
// Two halves make one sync per phase enough: a rank writes a half again only after a later
// sync, which every rank reaches only once it has finished reading that half. Within a piece
// of the allreduce a rank writes its slot's share after the first sync while the others read
// the rest of that slot: the shares do not overlap, and no rank reads another's share before
// the second sync.
//
// Same bits as asio-ring. The ring cuts the buffer into W segments; segment k starts at rank
// k and travels around the ring, each rank reducing its own values with what arrived
// (acc = op(own, arrived)), so rank k-1 ends with op(x[k-1], op(..., op(x[k+1], x[k]))).
// Here the rank whose share holds an element applies exactly that sequence, operands in the
// ring's order: sum <- op(x[k+1], x[k]), then sum <- op(x[k+j], sum) for j = 2 .. W-1
// (reduce_pair()), into its own slot, where the others read the result, and its own buffer.
// A rank's own values never pass through its slot: a piece costs each rank one copy of what
// the others reduce, the sum, and one copy of what the others reduced. The first form copied
// the whole piece in, reduced in place across the slots and copied the whole piece out (at
// W=2, 2.5 buffers written a rank, now 2); with that and pieces of 2 MiB (a slot then), not
// 256 KiB, which keeps a piece and the slots it meets in a core's cache, W=2 took 1.5-1.7x as
// long from 1 MiB (BENCHMARKS.md, "Allreduce through shared memory").
//
// That form stays where the values change type on the way: data reduced in a wider type
// (f16 and bf16 in f32), or a reduced-precision wire. There the ring sends wire words and
// rounds at every hop, and the words area takes their place: words = narrow(slot k), then
// reduce_from_wire() into each next slot (slot k+j <- op(slot k+j, slot k+j-1)), the same
// kernel the ring runs on arrival, so the rounding is the same; the result stands in slot
// k-1, or in the words.
//
// Waits are bounded by the timeout. A rank that never arrives is named; on Linux a rank
// whose process has exited is named at once, and a rank that fails marks the rank it blames
// in its control block so that the others stop waiting too.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <random>
#include <thread>

#if defined(_WIN32)
#include <process.h>
#else
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#endif

#if defined(__linux__)
#include <sys/uio.h>
#endif

#include "comm_backends/collective_call.h"
#include "comm_backends/reduction.h"
#include "comm_backends/shm/shm_region.h"
#include "common/errors.h"
#include "common/process_state.h"

namespace partrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Which ranks write which parts of the slots, and how large the slots are, are part of the
// format: ranks of two builds that lay the region out differently must not meet in one region.
constexpr std::uint64_t kRegionMagic = 0x384d485354524150ull;  // "PARTSHM8"
// The control blocks follow the header; the region starts on a page, so a header of 128
// bytes puts every block on its alignas(128) boundary (checked below).
constexpr std::size_t kHeaderBytes = 128;
constexpr std::size_t kPage = 4096;
// The pieces of allreduce_direct(), reduce_scatter_direct() and allgather(): small
// enough that a piece, the slot it goes through and the others' slots it is reduced with stay
// in a core's second-level cache between the syncs (BENCHMARKS.md, "Allreduce through shared
// memory"), and what it sums at a time: a block that stays in the first-level cache.
constexpr std::size_t kDirectPieceBytes = 256 << 10;
constexpr std::size_t kReduceBlockBytes = 16 << 10;
// The broadcast's pieces (Note [The broadcast as a stream]): at W=2, 4 MiB took 312-315 us in
// pieces of 8 KiB, 326-329 in 16, 318-335 in 32 and 328-332 in 64; 64 KiB 4.6-4.8, 4.7-4.8,
// 4.9-5.1 and 6.3-6.5 (BENCHMARKS.md, "The broadcast as a stream").
constexpr std::size_t kStreamPieceBytes = 8 << 10;
static_assert(kShmStreamBytes % kStreamPieceBytes == 0, "the stream is a ring of whole pieces");
// A sync's wait: rounds of spinning (none where ranks share cores), then of yielding, then it
// sleeps (sync()).
constexpr std::uint64_t kSpins = 2000, kYieldRounds = 2000;
static_assert(kDirectPieceBytes <= kShmSlotBytes, "a piece must fit in a slot");
// The allgather reads blocks of at least this many bytes straight from the other ranks'
// processes (Note [Reading another rank's memory]).
constexpr std::size_t kSingleCopyBytes = 128 << 10;

using Kind = CollectiveKind;

// One per rank, on a cache line pair of its own so that ranks polling one another's counts
// do not also fight over the line being written.
struct alignas(128) RankState {
  std::atomic<std::uint64_t> arrived;  // syncs entered
  std::atomic<std::int64_t> pid;
  std::atomic<std::int32_t> blamed;  // 0: none; r + 1: this rank failed, and names rank r
  // Single-copy reads (Note [Reading another rank's memory]): where a word of this process
  // holding `probe_value` stands, this rank's verdict on reading every other rank's (0: not
  // yet given, 1: can, 2: cannot), where the input of its current allgather is, and the
  // sequence number of the call in which a read of it failed (0: none).
  std::atomic<std::uint64_t> probe_address;
  std::atomic<std::uint64_t> probe_value;
  std::atomic<std::int32_t> single_copy_verdict;
  std::atomic<std::uint64_t> block_address;
  std::atomic<std::uint64_t> read_failed;
  // The broadcast's stream (Note [The broadcast as a stream]): pieces this rank has written
  // as a root, and read from a root, counted over all broadcasts of the communicator.
  std::atomic<std::uint64_t> published;
  std::atomic<std::uint64_t> consumed;
  // What the rank called, published with `arrived` of the call's first sync; two, by the
  // call's sequence number, because a rank may enter its next call while a slower one still
  // compares this one (a one-sync call lets it).
  CollectiveCall call[2];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory syncs need address-free atomics");

struct RegionHeader {
  std::uint64_t magic;
  std::uint32_t world;
  // ShmOptions::shared_cores of rank 0, which every rank must share: it decides how a
  // broadcast goes (in step, or as a stream).
  std::uint32_t shared_cores;
};
static_assert(sizeof(RegionHeader) <= kHeaderBytes && kHeaderBytes % alignof(RankState) == 0,
              "the control blocks must start on their alignment");

std::size_t control_bytes(int world) {
  const std::size_t end = kHeaderBytes + sizeof(RankState) * static_cast<std::size_t>(world);
  return (end + kPage - 1) / kPage * kPage;
}

std::size_t half_bytes(int world) {
  return static_cast<std::size_t>(world) * kShmSlotBytes + kShmSlotBytes / 2;
}

RankState& state_of(std::uint8_t* region, int rank) {
  return *reinterpret_cast<RankState*>(region + kHeaderBytes + sizeof(RankState) * rank);
}

// Whether the process is gone (exited, or a zombie nobody has reaped yet). Only where the
// system says so for sure; elsewhere the timeout decides.
bool process_gone(std::int64_t pid) {
#if defined(_WIN32)
  (void)pid;
  return false;
#else
  if (pid <= 0 || pid == current_process_id()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  return process_state_letter(pid) == "Z";
#endif
}

// Ring segment k of `count` elements: [segment_begin(k), segment_begin(k + 1)), as the
// ring's equal_segments() cuts them.
std::size_t segment_begin(std::size_t count, int world, int k) {
  return count * static_cast<std::size_t>(k) / static_cast<std::size_t>(world);
}

#if defined(__linux__)
// Copies `bytes` at address `remote` of process `pid` to `local`; returns how many it copied,
// short where the process is gone, part of the range is not mapped, or the kernel will not.
std::size_t read_process(std::int64_t pid, std::uint64_t remote, void* local, std::size_t bytes) {
  auto* to = static_cast<std::uint8_t*>(local);
  std::size_t done = 0;
  while (done < bytes) {  // each round copies at least a byte or ends the loop
    iovec here{to + done, bytes - done};
    iovec there{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid), &here, 1, &there, 1, 0);
    if (got <= 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}
#endif

// Calls f(k, begin, end) for each ring segment k that meets [begin, end), with the part
// that lies inside.
// sum <- the `len` values at value(q) of ranks first, first + 1, ..., first + W - 1 (mod W),
// reduced in the ring's order: op(x[first + 1], x[first]), then op(x[first + j], sum) for j =
// 2 .. W - 1 (reduce_pair()), then divided by `divisor` unless it is 1. The chain the ring
// applies to a segment that starts at rank `first`.
template <typename Value>
void reduce_chain(std::uint8_t* sum, int first, int world, Value&& value, DType type,
                  std::size_t len, ReduceOp op, int divisor) {
  reduce_pair(sum, value((first + 1) % world), value(first), type, len, op);
  for (int j = 2; j < world; ++j) reduce_pair(sum, value((first + j) % world), sum, type, len, op);
  if (divisor != 1) divide_elements(sum, type, len, divisor);
}

template <typename F>
void for_each_segment(std::size_t count, int world, std::size_t begin, std::size_t end, F&& f) {
  for (int k = 0; k < world && begin < end; ++k) {
    const std::size_t lo = std::max(begin, segment_begin(count, world, k));
    const std::size_t hi = std::min(end, segment_begin(count, world, k + 1));
    if (lo < hi) f(k, lo, hi);
  }
}

}  // namespace

struct ShmCollectives::Call {
  CollectiveCall words;
};

std::size_t shm_region_bytes(int world) {
  return control_bytes(world) + 2 * half_bytes(world) + kShmStreamBytes;
}

std::optional<std::string> shm_region_misfit(int world, std::uint64_t room) {
  const std::size_t region = shm_region_bytes(world);
  if (region <= room) return std::nullopt;
  return shm_region_text(region) + " for " + std::to_string(world) +
         " ranks does not fit in /dev/shm (" + std::to_string(room >> 20) +
         " MiB free; docker run --shm-size gives a container more)";
}

ShmCollectives::ShmCollectives(void* region, int rank, int world, ShmOptions options)
    : region_(static_cast<std::uint8_t*>(region)),
      rank_(rank),
      world_(world),
      timeout_(options.timeout),
      rank_names_(std::move(options.rank_names)),
      shared_cores_(options.shared_cores),
      single_copy_allowed_(options.single_copy) {
  PARTRAIN_CHECK(world >= 1 && rank >= 0 && rank < world, UsageError, "shm: rank ", rank,
                 " is outside a world of ", world);
  PARTRAIN_CHECK(rank_names_.empty() || rank_names_.size() == static_cast<std::size_t>(world),
                 UsageError, "shm: ", rank_names_.size(), " rank names for a world of ", world);
  auto* header = reinterpret_cast<RegionHeader*>(region_);
  if (rank == 0) {
    // The creator lays out the control blocks in the zero-filled region before anyone else
    // maps it (the backend publishes the region's name only afterwards).
    for (int r = 0; r < world; ++r) new (&state_of(region_, r)) RankState{};
    header->world = static_cast<std::uint32_t>(world);
    header->shared_cores = shared_cores_ ? 1 : 0;
    header->magic = kRegionMagic;
  }
  PARTRAIN_CHECK(
      header->magic == kRegionMagic && header->world == static_cast<std::uint32_t>(world),
      CommError, "shm: the shared region is not one of this run's (", world,
      " ranks expected), or another build of partrain laid it out: run the same build on every "
      "rank");
  PARTRAIN_CHECK(header->shared_cores == (shared_cores_ ? 1u : 0u), CommError, "shm: rank ",
                 name_of(rank), (shared_cores_ ? " shares" : " does not share"),
                 " cores with the other ranks of its host, and rank ", name_of(0),
                 " says otherwise");
#if !defined(__linux__)
  single_copy_ = SingleCopy::no;  // no cross-memory reads (the same on every rank of a host)
#endif
  // A value no other process holds at this address by chance (a process of another pid
  // namespace that has the same pid, say, and maps this program at the same place).
  std::uint64_t noise = 0;
  try {
    std::random_device random;
    noise = static_cast<std::uint64_t>(random()) << 32 ^ random();
  } catch (const std::exception&) {  // no entropy source: the clock and the pid must do
    noise = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
            static_cast<std::uint64_t>(current_process_id()) << 40;
  }
  probe_word_ = noise ^ reinterpret_cast<std::uintptr_t>(this);
  RankState& me = state_of(region_, rank);
  me.probe_address.store(reinterpret_cast<std::uintptr_t>(&probe_word_), std::memory_order_relaxed);
  me.probe_value.store(probe_word_, std::memory_order_relaxed);
  me.pid.store(current_process_id(), std::memory_order_release);
}

std::uint8_t* ShmCollectives::slot(int half, int rank) const {
  return region_ + control_bytes(world_) + half * half_bytes(world_) +
         static_cast<std::size_t>(rank) * kShmSlotBytes;
}

std::uint8_t* ShmCollectives::stream_area() const {
  return region_ + control_bytes(world_) + 2 * half_bytes(world_);
}

std::uint16_t* ShmCollectives::words(int half) const {
  return reinterpret_cast<std::uint16_t*>(slot(half, world_));
}

void ShmCollectives::sync(const Call& call, int phase, std::chrono::milliseconds extra) {
  const std::uint64_t target = arrive(call, phase == 0);
  wait_for(call, extra, [&] { return first_not_arrived(target); });
  if (phase == 0) check_peers(call, phase);
}

std::uint64_t ShmCollectives::arrive(const Call& call, bool first) {
  RankState& me = state_of(region_, rank_);
  if (first) me.call[call.words.sequence % 2] = call.words;
  const std::uint64_t target = ++syncs_;
  me.arrived.store(target, std::memory_order_release);
  return target;
}

int ShmCollectives::first_not_arrived(std::uint64_t target) const {
  for (int r = 0; r < world_; ++r) {
    if (state_of(region_, r).arrived.load(std::memory_order_acquire) < target) return r;
  }
  return -1;
}

template <typename Missing>
void ShmCollectives::wait_for(const Call& call, std::chrono::milliseconds extra,
                              Missing&& missing) {
  if (missing() < 0) return;
  // Spin briefly (a peer on another core arrives within microseconds), then yield, then
  // sleep, so that more ranks than cores still make progress; the deadline bounds it all.
  // Where the ranks share cores the peer being waited for may need this core, so the wait
  // yields from the first round: 4 KiB at W=4 on 2 CPUs, bound two to a CPU, took 5.5-6.1 us
  // (allreduce), 3.4 (reduce_scatter) and 2.8 (allgather) against 9.3-9.8, 9.2-9.4 and 8.5-8.7
  // spinning first (BENCHMARKS.md, "Reduce-scatter and allgather through shared memory, and
  // ranks that share cores").
  // A wait that has lasted kPatientAfter (a leader in its collective across hosts, a rank
  // still in its backward pass) sleeps kPatientSleep per round and checks for failures on
  // every round: its wake-ups would otherwise take CPU from the ranks doing the work.
  const std::uint64_t spins = shared_cores_ ? 0 : kSpins, yields = spins + kYieldRounds;
  constexpr auto kPatientAfter = std::chrono::milliseconds(10);
  constexpr auto kPatientSleep = std::chrono::milliseconds(1);
  bool patient = false;
  const auto start = Clock::now();
  const auto bound = timeout_ + extra;
  const auto deadline = start + bound;
  auto next_pid_check = start + std::chrono::milliseconds(1);
  for (std::uint64_t round = 0;; ++round) {
    const int waited_for = missing();
    if (waited_for < 0) return;
    if (round % 256 == 255 || patient) {
      for (int r = 0; r < world_; ++r) {
        const int blamed = state_of(region_, r).blamed.load(std::memory_order_acquire);
        if (blamed > 0 && r != rank_) {
          broken_ = true;
          // Blamed itself (it came late, was away, or a failure was traced to it): the blamer
          // gave up on it and leaves, so that is the rank this one lost.
          if (blamed - 1 == name_of(rank_)) {
            throw PeerError(name_of(r), "shm: rank " + std::to_string(name_of(r)) +
                                            " gave up on this rank during " +
                                            call.words.describe());
          }
          throw PeerError(blamed - 1, "shm: rank " + std::to_string(blamed - 1) + " failed (rank " +
                                          std::to_string(name_of(r)) + " saw it) during " +
                                          call.words.describe());
        }
      }
      const auto now = Clock::now();
      const std::int64_t pid = state_of(region_, waited_for).pid.load(std::memory_order_acquire);
      bool gone = false;
      if (now >= next_pid_check) {  // a system call: not on every round
        gone = process_gone(pid);
        next_pid_check = now + std::chrono::milliseconds(1);
      }
      if (gone || now >= deadline) {
        broken_ = true;
        state_of(region_, rank_).blamed.store(name_of(waited_for) + 1, std::memory_order_release);
        throw PeerError(
            name_of(waited_for),
            "shm: rank " + std::to_string(name_of(waited_for)) +
                (gone ? " (pid " + std::to_string(pid) + ") exited"
                      : " did not arrive within " + std::to_string(bound.count()) + " ms") +
                " during " + call.words.describe() +
                (gone ? "" : " (dead, hung, or not calling the same collective)"));
      }
    }
    if (round < spins) {
      continue;
    } else if (round < yields) {
      std::this_thread::yield();
    } else if (patient) {
      std::this_thread::sleep_for(kPatientSleep);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      patient = Clock::now() - start >= kPatientAfter;
    }
  }
}

void ShmCollectives::check_peers(const Call& call, int) {
  for (int r = 0; r < world_; ++r) check_peer(call, r);
}

void ShmCollectives::check_peer(const Call& call, int r) {
  const CollectiveCall& theirs = state_of(region_, r).call[call.words.sequence % 2];
  if (std::memcmp(&theirs, &call.words, sizeof theirs) != 0) {
    broken_ = true;
    throw CommError("shm: ranks disagree: rank " + std::to_string(name_of(r)) + " called " +
                    theirs.describe() + " while rank " + std::to_string(name_of(rank_)) +
                    " called " + call.words.describe());
  }
}

void ShmCollectives::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                               DType wire) {
  PARTRAIN_CHECK(!broken_, CommError,
                 "shm: broken by an earlier failure; create a new communicator");
  if (world_ == 1) return;
  PARTRAIN_CHECK(count == 0 || data != nullptr, UsageError, "allreduce: null buffer");
  const DType acc = accumulator_type(dtype);
  if (acc != DType::f32 || (wire != DType::f16 && wire != DType::bf16)) wire = acc;
  const bool narrow = acc != wire;
  const std::size_t work_elem = dtype_size(acc), data_elem = dtype_size(dtype);
  const int divisor = op == ReduceOp::avg ? world_ : 1;
  const int W = world_;

  Call call;
  call.words.sequence = ++sequence_;
  call.words.elements = count;
  call.words.kind = static_cast<std::uint8_t>(Kind::allreduce);
  call.words.dtype = static_cast<std::uint8_t>(dtype);
  call.words.wire = static_cast<std::uint8_t>(wire);
  call.words.op = static_cast<std::uint8_t>(op);
  if (count == 0) return sync(call, 0);
  auto* bytes = static_cast<std::uint8_t*>(data);
  if (!narrow && acc == dtype) return allreduce_direct(call, bytes, count, dtype, op);
  const std::size_t piece_elems = kShmSlotBytes / work_elem;
  for (std::size_t p0 = 0; p0 < count; p0 += piece_elems) {
    const std::size_t n = std::min(piece_elems, count - p0);
    const int h = half_;
    half_ ^= 1;
    // 1. My values, in the type the ring reduces in.
    if (acc != dtype) {
      convert_elements(bytes + p0 * data_elem, dtype, slot(h, rank_), acc, n);
    } else {
      std::memcpy(slot(h, rank_), bytes + p0 * data_elem, n * data_elem);
    }
    sync(call, p0 == 0 ? 0 : 1);
    // 2. My share of the piece, in the ring's order for each element's segment.
    const std::size_t share_begin = p0 + n * rank_ / W, share_end = p0 + n * (rank_ + 1) / W;
    for_each_segment(count, W, share_begin, share_end, [&](int k, std::size_t lo, std::size_t hi) {
      const std::size_t at = lo - p0, len = hi - lo;
      if (narrow) {
        std::uint16_t* w = words(h) + at;
        narrow_to_wire(reinterpret_cast<const float*>(slot(h, k)) + at, w, wire, len);
        for (int j = 1; j < W; ++j) {
          reduce_from_wire(reinterpret_cast<float*>(slot(h, (k + j) % W)) + at, w, wire, len, op,
                           j == W - 1, divisor);
        }
      } else {
        for (int j = 1; j < W; ++j) {
          std::uint8_t* own = slot(h, (k + j) % W) + at * work_elem;
          reduce_into(own, acc, slot(h, (k + j - 1) % W) + at * work_elem, acc, len, op);
          if (j == W - 1 && divisor != 1) divide_elements(own, acc, len, divisor);
        }
      }
    });
    sync(call, 1);
    // 3. Everyone's results: segment k's stand in slot k-1 (or, narrowed, in the words).
    for_each_segment(count, W, p0, p0 + n, [&](int k, std::size_t lo, std::size_t hi) {
      const std::size_t at = lo - p0, len = hi - lo;
      std::uint8_t* out = bytes + lo * data_elem;
      if (narrow) {
        if (dtype == DType::f32) {
          widen_from_wire(words(h) + at, reinterpret_cast<float*>(out), wire, len);
        } else {
          // f16/bf16 data on a narrow wire: widen as the ring does, then back to the data's type.
          float widened[1024];
          for (std::size_t done = 0; done < len; done += std::size(widened)) {
            const std::size_t m = std::min(std::size(widened), len - done);
            widen_from_wire(words(h) + at + done, widened, wire, m);
            convert_elements(widened, DType::f32, out + done * data_elem, dtype, m);
          }
        }
      } else {
        const std::uint8_t* result = slot(h, (k + W - 1) % W) + at * work_elem;
        if (acc != dtype) {
          convert_elements(result, acc, out, dtype, len);
        } else {
          std::memcpy(out, result, len * data_elem);
        }
      }
    });
  }
}

void ShmCollectives::allreduce_direct(const Call& call, std::uint8_t* data, std::size_t count,
                                      DType type, ReduceOp op) {
  const int W = world_;
  const std::size_t elem = dtype_size(type);
  const int divisor = op == ReduceOp::avg ? W : 1;
  const std::size_t piece_elems = kDirectPieceBytes / elem;
  const std::size_t block_elems = kReduceBlockBytes / elem;
  for (std::size_t p0 = 0; p0 < count; p0 += piece_elems) {
    const std::size_t n = std::min(piece_elems, count - p0);
    const int h = half_;
    half_ ^= 1;
    // Rank q reduces the elements [share_begin(q), share_begin(q + 1)) of the piece.
    auto share_begin = [&](int q) { return p0 + n * static_cast<std::size_t>(q) / W; };
    const std::size_t mine = share_begin(rank_), mine_end = share_begin(rank_ + 1);
    std::uint8_t* my_slot = slot(h, rank_);
    // 1. My values that the other ranks reduce: all of the piece but my share.
    std::memcpy(my_slot, data + p0 * elem, (mine - p0) * elem);
    std::memcpy(my_slot + (mine_end - p0) * elem, data + mine_end * elem,
                (p0 + n - mine_end) * elem);
    sync(call, p0 == 0 ? 0 : 1);
    // 2. My share, each element's values in the ring's order for its segment, a block at a
    // time so that the sum stays in cache: into my slot, for the others, and into my buffer.
    auto value = [&](int q, std::size_t e) -> const std::uint8_t* {
      return q == rank_ ? data + e * elem : slot(h, q) + (e - p0) * elem;
    };
    for_each_segment(count, W, mine, mine_end, [&](int k, std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; b += block_elems) {
        const std::size_t len = std::min(block_elems, hi - b);
        std::uint8_t* sum = my_slot + (b - p0) * elem;
        reduce_chain(
            sum, k, W, [&](int q) { return value(q, b); }, type, len, op, divisor);
        std::memcpy(data + b * elem, sum, len * elem);
      }
    });
    sync(call, 1);
    // 3. The others' shares, from their slots.
    for (int q = 0; q < W; ++q) {
      if (q == rank_) continue;
      const std::size_t begin = share_begin(q), end = share_begin(q + 1);
      std::memcpy(data + begin * elem, slot(h, q) + (begin - p0) * elem, (end - begin) * elem);
    }
  }
}

// Like asio-ring's ring reduce-scatter, to the bit: block k's chain starts at rank k + 1 and
// ends at rank k (ring_reduce_scatter()), so the rank that owns block k applies that sequence,
// and no other rank touches block k. Each piece holds the same element range of every block,
// side by side in each rank's slot. Data reduced in its own type goes as the allreduce does
// (reduce_scatter_direct()): a rank copies in only the blocks the others reduce and reduces its
// own from their slots and its own input straight into its output, in pieces that hold 256 KiB
// of the input; at W=2 that took 61 us for 1 MiB and 1.6 ms for 16 MiB against 100-103 us and
// 2.3 ms reduced in place across the slots (BENCHMARKS.md, "Reduce-scatter and allgather
// through shared memory, and ranks that share cores"). Otherwise (a wider accumulator, a narrow
// wire) the owner reduces in place across the slots, as below. Either way one sync a piece
// suffices: besides its own slot, a rank writes at most its own block of the others' slots, which
// no other rank reads.
void ShmCollectives::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                    ReduceOp op, DType wire) {
  PARTRAIN_CHECK(!broken_, CommError,
                 "shm: broken by an earlier failure; create a new communicator");
  const int W = world_;
  const std::size_t data_elem = dtype_size(dtype);
  if (W == 1) {
    if (count > 0) std::memmove(out, in, count * data_elem);
    return;
  }
  PARTRAIN_CHECK(count == 0 || (in != nullptr && out != nullptr), UsageError,
                 "reduce_scatter: null buffer");
  const DType acc = accumulator_type(dtype);
  if (acc != DType::f32 || (wire != DType::f16 && wire != DType::bf16)) wire = acc;
  const bool narrow = acc != wire;
  const std::size_t work_elem = dtype_size(acc);
  const int divisor = op == ReduceOp::avg ? W : 1;

  Call call;
  call.words.sequence = ++sequence_;
  call.words.elements = count;
  call.words.kind = static_cast<std::uint8_t>(Kind::reduce_scatter);
  call.words.dtype = static_cast<std::uint8_t>(dtype);
  call.words.wire = static_cast<std::uint8_t>(wire);
  call.words.op = static_cast<std::uint8_t>(op);
  if (count == 0) return sync(call, 0);
  const auto* source = static_cast<const std::uint8_t*>(in);
  auto* target = static_cast<std::uint8_t*>(out);
  if (!narrow && acc == dtype) return reduce_scatter_direct(call, source, target, count, dtype, op);
  const std::size_t piece_elems = kShmSlotBytes / work_elem / static_cast<std::size_t>(W);
  const int k = rank_;
  for (std::size_t p0 = 0; p0 < count; p0 += piece_elems) {
    const std::size_t n = std::min(piece_elems, count - p0);
    const int h = half_;
    half_ ^= 1;
    // 1. This piece of every block, in the type the ring reduces in.
    for (int b = 0; b < W; ++b) {
      const std::uint8_t* from = source + (static_cast<std::size_t>(b) * count + p0) * data_elem;
      std::uint8_t* to = slot(h, rank_) + static_cast<std::size_t>(b) * n * work_elem;
      if (acc != dtype) {
        convert_elements(from, dtype, to, acc, n);
      } else {
        std::memcpy(to, from, n * data_elem);
      }
    }
    sync(call, p0 == 0 ? 0 : 1);
    // 2. Block k (this rank's): ranks k+1, k+2, ..., k in turn, as the ring reduces it.
    const std::size_t at = static_cast<std::size_t>(k) * n;
    const std::uint8_t* result = nullptr;
    if (narrow) {
      std::uint16_t* w = words(h) + at;
      narrow_to_wire(reinterpret_cast<const float*>(slot(h, (k + 1) % W)) + at, w, wire, n);
      for (int j = 1; j < W; ++j) {
        reduce_from_wire(reinterpret_cast<float*>(slot(h, (k + 1 + j) % W)) + at, w, wire, n, op,
                         j == W - 1, divisor);
      }
    } else {
      for (int j = 1; j < W; ++j) {
        std::uint8_t* own = slot(h, (k + 1 + j) % W) + at * work_elem;
        reduce_into(own, acc, slot(h, (k + j) % W) + at * work_elem, acc, n, op);
        if (j == W - 1 && divisor != 1) divide_elements(own, acc, n, divisor);
      }
    }
    result = slot(h, k) + at * work_elem;
    if (acc != dtype) {
      convert_elements(result, acc, target + p0 * data_elem, dtype, n);
    } else {
      std::memcpy(target + p0 * data_elem, result, n * data_elem);
    }
  }
}

void ShmCollectives::reduce_scatter_direct(const Call& call, const std::uint8_t* source,
                                           std::uint8_t* target, std::size_t count, DType type,
                                           ReduceOp op) {
  const int W = world_, k = rank_;
  const std::size_t elem = dtype_size(type);
  const int divisor = op == ReduceOp::avg ? W : 1;
  // A piece holds the same n elements of every block, as in reduce_scatter() above; W * n
  // elements are one allreduce piece.
  const std::size_t piece_elems =
      std::max<std::size_t>(1, kDirectPieceBytes / elem / static_cast<std::size_t>(W));
  const std::size_t block_elems = kReduceBlockBytes / elem;
  for (std::size_t p0 = 0; p0 < count; p0 += piece_elems) {
    const std::size_t n = std::min(piece_elems, count - p0);
    const int h = half_;
    half_ ^= 1;
    // 1. This piece of the blocks the others reduce, block b at b * n in my slot.
    for (int b = 0; b < W; ++b) {
      if (b == k) continue;
      std::memcpy(slot(h, k) + static_cast<std::size_t>(b) * n * elem,
                  source + (static_cast<std::size_t>(b) * count + p0) * elem, n * elem);
    }
    sync(call, p0 == 0 ? 0 : 1);
    // 2. Block k, a block of elements at a time: ranks k+1, k+2, ..., k in turn (its chain
    // starts at rank k + 1), the last from my own input, straight into the output. No rank
    // writes another's slot.
    auto value = [&](int q, std::size_t e) -> const std::uint8_t* {
      return q == k ? source + (static_cast<std::size_t>(k) * count + e) * elem
                    : slot(h, q) + (static_cast<std::size_t>(k) * n + e - p0) * elem;
    };
    for (std::size_t b = p0; b < p0 + n; b += block_elems) {
      const std::size_t len = std::min(block_elems, p0 + n - b);
      reduce_chain(
          target + b * elem, (k + 1) % W, W, [&](int q) { return value(q, b); }, type, len, op,
          divisor);
    }
  }
}

void ShmCollectives::mark_failed(int blamed) {
  broken_ = true;
  state_of(region_, rank_).blamed.store(blamed + 1, std::memory_order_release);
}

void ShmCollectives::broadcast(void* data, std::size_t bytes, int root) {
  broadcast(data, bytes, root, std::chrono::milliseconds(0));
}

// Note [The broadcast as a stream]
// The region ends in a stream area (kShmStreamBytes), a ring of kStreamPieceBytes pieces. The
// root copies its data into the ring a piece at a time and after each publishes how many
// pieces it has written (RankState::published, counted over all broadcasts); every other rank
// copies each piece out as soon as it is published, as many at a time as are there, and
// publishes how many it has read (consumed). The root's copy and the others' overlap from the
// first piece and meet at no sync between pieces: through the slots, a piece at a time with a sync
// between, 64 KiB at W=2 took 9.6 us, one copy after the other, against vader's 7.7 (BENCHMARKS.md,
// "The broadcast in smaller pieces" and "The broadcast as a stream").
//
// No piece is overwritten unread: before a call's first piece the root waits until every
// other rank has read all pieces of the calls before (by then long done, as a rule), and
// before a piece a ring's length into the call, until they have read the one it replaces. So
// the root leaves without waiting for the others to read. A call of one piece puts it at the
// ring's first piece every time, a longer one goes on where the last call's ended: at W=2, 4
// KiB took 1.2-1.3 us at the first piece every time, 1.6-1.7 going on around the ring; 64 KiB
// 4.8-5.0 going on, 7.8-8.0 from the first piece every time. Why the two differ so is not
// known; each is kept where it measured faster.
//
// Entering counts as arriving at a sync, and a rank leaves once every rank has entered, so
// that no rank is more than one call ahead of another (each control block holds a rank's
// last two calls, which the others check theirs against); before reading, the others check
// that the root called the same broadcast. The slots' halves are left as the collective
// before left them.
void ShmCollectives::broadcast(void* data, std::size_t bytes, int root,
                               std::chrono::milliseconds extra) {
  PARTRAIN_CHECK(!broken_, CommError,
                 "shm: broken by an earlier failure; create a new communicator");
  PARTRAIN_CHECK(root >= 0 && root < world_, UsageError, "broadcast: root ", root,
                 " is outside a world of ", world_);
  if (world_ == 1) return;
  Call call;
  call.words.sequence = ++sequence_;
  call.words.bytes = bytes;
  call.words.root = root;
  call.words.kind = static_cast<std::uint8_t>(Kind::broadcast);
  if (bytes == 0) return sync(call, 0, extra);
  auto* out = static_cast<std::uint8_t*>(data);
  if (shared_cores_ && bytes > kDirectPieceBytes) {
    // Where ranks share cores, larger data goes in step, a piece at a time: the root copies a
    // piece into its slot and, after a sync, the others copy it out while the root copies
    // the next into the other half. W=4 on 2 CPUs, 4 MiB took 833-853 us so against 941-945
    // as a stream, 16 MiB 3418-3541 against 3658-3746 (BENCHMARKS.md, "The broadcast as a
    // stream"): the syncs hand the CPU to the rank that needs it next.
    for (std::size_t p0 = 0; p0 < bytes; p0 += kDirectPieceBytes) {
      const std::size_t n = std::min(kDirectPieceBytes, bytes - p0);
      const int h = half_;
      half_ ^= 1;
      if (rank_ == root) std::memcpy(slot(h, root), out + p0, n);
      if (p0 == 0) {
        sync(call, 0, extra);
      } else {
        sync(call, 1);
      }
      if (rank_ != root) std::memcpy(out + p0, slot(h, root), n);
    }
    return;
  }
  // Note [The broadcast as a stream]
  const std::uint64_t target = arrive(call, true);
  RankState& me = state_of(region_, rank_);
  RankState& source = state_of(region_, root);
  const std::size_t pieces = (bytes + kStreamPieceBytes - 1) / kStreamPieceBytes;
  const std::size_t ring = kShmStreamBytes / kStreamPieceBytes;
  const std::uint64_t base = streamed_;
  const std::size_t start = pieces == 1 ? 0 : stream_next_;
  streamed_ += pieces;
  stream_next_ = (start + pieces) % ring;
  auto piece_at = [&, stream = stream_area()](std::size_t i) {
    return stream + (start + i) % ring * kStreamPieceBytes;
  };
  if (rank_ == root) {
    std::uint64_t read_by_all = 0;  // pieces every other rank has read, at least
    for (std::size_t i = 0; i < pieces; ++i) {
      // Every piece of the calls before, and this call's piece a ring ago, must have been read.
      const std::uint64_t read = base + (i >= ring ? i - ring + 1 : 0);
      if (read > read_by_all) {
        wait_for(call, std::chrono::milliseconds(0), [&] {
          read_by_all = ~std::uint64_t{0};
          int behind = -1;
          for (int r = 0; r < world_; ++r) {
            if (r == root) continue;
            const std::uint64_t done =
                state_of(region_, r).consumed.load(std::memory_order_acquire);
            read_by_all = std::min(read_by_all, done);
            if (done < read && behind < 0) behind = r;
          }
          return behind;
        });
      }
      const std::size_t p0 = i * kStreamPieceBytes;
      std::memcpy(piece_at(i), out + p0, std::min(kStreamPieceBytes, bytes - p0));
      me.published.store(base + i + 1, std::memory_order_release);
    }
    me.consumed.store(base + pieces, std::memory_order_release);  // nothing of its own to read
  } else {
    wait_for(call, extra,
             [&] { return source.arrived.load(std::memory_order_acquire) >= target ? -1 : root; });
    check_peer(call, root);
    for (std::size_t i = 0; i < pieces;) {
      std::uint64_t published = 0;
      wait_for(call, std::chrono::milliseconds(0), [&] {
        published = source.published.load(std::memory_order_acquire);
        return published > base + i ? -1 : root;
      });
      // Every piece published so far, up to the end of the ring, in one copy.
      const std::uint64_t ready = published - base;
      const std::size_t ring_end = i + ring - (start + i) % ring;
      const std::size_t last = std::min<std::size_t>({ready, pieces, ring_end});
      const std::size_t p0 = i * kStreamPieceBytes, p1 = std::min(last * kStreamPieceBytes, bytes);
      std::memcpy(out + p0, piece_at(i), p1 - p0);
      i = last;
      me.consumed.store(base + i, std::memory_order_release);
    }
  }
  wait_for(call, extra, [&] { return first_not_arrived(target); });
  check_peers(call, 0);
}

// Note [Reading another rank's memory]
// Through the slots an allgather costs each rank a copy of its block into its slot and a
// copy of every other block out of theirs. Linux lets a process read another's memory
// directly (process_vm_readv, the kernel's cross-memory attach, which Open MPI's shared-memory
// transport takes for large messages): each rank publishes where its input is and, after a
// sync, reads every other rank's block straight into its output, starting each at a different
// rank; a second sync keeps every input unchanged until all have read it. A read that fails
// (memory the kernel will not read across processes, such as some drivers' mappings, or a
// rank that died) is told to all at that sync: every rank then runs the call again through
// the slots, every input still as it was, and keeps to the slots from then on; a rank that
// died is named by the sync, as always. One copy a block instead of two: W=2, 1 MiB 53-55 us
// against 62-64 through the slots, 16 MiB 1.34-1.43 ms against 1.50-1.53, four runs each
// (BENCHMARKS.md, "The allgather in one copy").
//
// The kernel allows it where this process may trace the other: the same user and a Yama
// ptrace_scope of 0 (at 1, Ubuntu's default, only a process's own descendants), or
// CAP_SYS_PTRACE where the scope is 1 or 2 (at 3 nothing may); and the pid each rank publishes must
// name it here (one pid namespace), and no seccomp filter refuse the call. So the ranks find out
// once, at the first allgather that would take it: each reads the word whose address and value
// every other rank published when it was made, and they take the path only if every rank could read
// every other's and none declines; otherwise every rank goes through the slots. A rank declines
// where ShmOptions says so (comm.shm_single_copy: false), and where ranks share its cores: there
// the reads took longer at 64 MiB (W=4 on 2 CPUs, 21.8-25.5 ms against 20.3-20.6) and no less
// below. Below kSingleCopyBytes a block the second sync and the system call cost about what the
// copy saves: blocks of 4 and 64 KiB took 1.8 and 8.4-8.5 us against 1.2 and 7.6-7.7 (of 32 KiB 4.9
// against 5.7); from 128 KiB it was faster at every size.
bool ShmCollectives::agree_on_single_copy(const Call& call) {
  sync(call, 0);  // every probe word is published
  bool can = single_copy_allowed_ && !shared_cores_;
#if defined(__linux__)
  for (int r = 0; r < world_ && can; ++r) {
    if (r == rank_) continue;
    const RankState& them = state_of(region_, r);
    std::uint64_t value = 0;
    can = read_process(them.pid.load(std::memory_order_acquire),
                       them.probe_address.load(std::memory_order_acquire), &value,
                       sizeof value) == sizeof value &&
          value == them.probe_value.load(std::memory_order_acquire);
  }
#endif
  state_of(region_, rank_).single_copy_verdict.store(can ? 1 : 2, std::memory_order_release);
  sync(call, 1);
  for (int r = 0; r < world_; ++r) {
    if (state_of(region_, r).single_copy_verdict.load(std::memory_order_acquire) != 1) {
      return false;
    }
  }
  return true;
}

bool ShmCollectives::allgather_single_copy(const Call& call, const std::uint8_t* source,
                                           std::uint8_t* target, std::size_t bytes_per_rank) {
  RankState& me = state_of(region_, rank_);
  me.block_address.store(reinterpret_cast<std::uintptr_t>(source), std::memory_order_relaxed);
  std::uint8_t* mine = target + rank_ * bytes_per_rank;
  if (mine != source) std::memcpy(mine, source, bytes_per_rank);  // while the others come
  sync(call, 0);
#if defined(__linux__)
  for (int k = 1; k < world_; ++k) {
    const int r = (rank_ + k) % world_;
    const RankState& them = state_of(region_, r);
    if (read_process(them.pid.load(std::memory_order_acquire),
                     them.block_address.load(std::memory_order_acquire),
                     target + r * bytes_per_rank, bytes_per_rank) != bytes_per_rank) {
      me.read_failed.store(call.words.sequence, std::memory_order_relaxed);
      break;
    }
  }
#endif
  sync(call, 1);  // names a rank that died; every rank has read (or failed to read) the inputs
  for (int r = 0; r < world_; ++r) {
    if (state_of(region_, r).read_failed.load(std::memory_order_acquire) == call.words.sequence) {
      single_copy_ = SingleCopy::no;
      return false;
    }
  }
  single_copy_sequence_ = sequence_;
  return true;
}

void ShmCollectives::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  PARTRAIN_CHECK(!broken_, CommError,
                 "shm: broken by an earlier failure; create a new communicator");
  auto* target = static_cast<std::uint8_t*>(out);
  const auto* source = static_cast<const std::uint8_t*>(in);
  std::uint8_t* mine = target + rank_ * bytes_per_rank;
  if (world_ == 1) {
    if (bytes_per_rank > 0 && mine != source) std::memmove(mine, source, bytes_per_rank);
    return;
  }
  Call call;
  call.words.sequence = ++sequence_;
  call.words.bytes = bytes_per_rank;
  call.words.kind = static_cast<std::uint8_t>(Kind::allgather);
  if (bytes_per_rank == 0) return sync(call, 0);
  if (bytes_per_rank >= kSingleCopyBytes && single_copy_ != SingleCopy::no) {
    if (single_copy_ == SingleCopy::unknown) {
      single_copy_ = agree_on_single_copy(call) ? SingleCopy::yes : SingleCopy::no;
    }
    if (single_copy_ == SingleCopy::yes &&
        allgather_single_copy(call, source, target, bytes_per_rank)) {
      return;
    }
  }
  // Pieces of 256 KiB a rank. This rank's own block, unless it is in place already, is copied
  // a piece at a time before the sync, while the piece is in cache and the others may still be
  // on their way (W=2, 16 MiB: 1.50-1.54 ms against 1.78-1.80 in pieces of 2 MiB with one
  // copy at the end). Where the ranks share cores there is no such wait to fill: there the
  // copy before each sync took 10 % longer at 64 MiB (W=4 on 2 CPUs), though up to 10 % less
  // from 1 to 16 MiB, and one copy at the end keeps the first form's times at every size
  // (BENCHMARKS.md, "Reduce-scatter and allgather through shared memory, and ranks that share
  // cores").
  const bool own_with_pieces = mine != source && !shared_cores_;
  for (std::size_t p0 = 0; p0 < bytes_per_rank; p0 += kDirectPieceBytes) {
    const std::size_t n = std::min(kDirectPieceBytes, bytes_per_rank - p0);
    const int h = half_;
    half_ ^= 1;
    std::memcpy(slot(h, rank_), source + p0, n);
    if (own_with_pieces) std::memcpy(mine + p0, source + p0, n);
    sync(call, p0 == 0 ? 0 : 1);
    for (int r = 0; r < world_; ++r) {
      if (r != rank_) std::memcpy(target + r * bytes_per_rank + p0, slot(h, r), n);
    }
  }
  if (mine != source && !own_with_pieces) std::memcpy(mine, source, bytes_per_rank);
}

void ShmCollectives::barrier() { barrier(std::chrono::milliseconds(0)); }

void ShmCollectives::barrier(std::chrono::milliseconds extra) {
  PARTRAIN_CHECK(!broken_, CommError,
                 "shm: broken by an earlier failure; create a new communicator");
  if (world_ == 1) return;
  Call call;
  call.words.sequence = ++sequence_;
  call.words.kind = static_cast<std::uint8_t>(Kind::barrier);
  sync(call, 0, extra);
}

}  // namespace partrain::comm
