// defines: ShmCollectives — allreduce, reduce_scatter, broadcast, allgather and barrier among the
// ranks of one host through a shared memory region; shm_region_bytes(), shm_region_misfit(). The
// algorithm and the region's layout: Note [Shared-memory collectives] in shm_collectives.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"

namespace partrain::comm {

// Bytes of one rank's slot in each of the region's two halves: collectives larger than a
// slot run in pieces of at most this much. The pieces of an allreduce or reduce-scatter of data
// in its own type, and of the allgather, were 256 KiB already; those through a wider type or a
// narrow wire took a whole slot of 2 MiB, and in pieces of 256 KiB took 0.78-1.07x as long (W=2
// and 4, 64 KiB to 64 MiB; reduce-scatter of bf16 at W=2, 1 MiB: 270-277 us against 344-388;
// the bf16 wire at W=2, 1 MiB: 293-308 against 273-289), while the region for 16 ranks shrank
// from 68 MiB, more than a container's /dev/shm holds by default, to 10 (BENCHMARKS.md, "Slots
// of 256 KiB").
inline constexpr std::size_t kShmSlotBytes = std::size_t{256} << 10;
// Bytes of the broadcast's stream (Note [The broadcast as a stream] in shm_collectives.cpp),
// at the region's end: a ring of 256 pieces of 8 KiB, whatever the world.
inline constexpr std::size_t kShmStreamBytes = std::size_t{2} << 20;

// The size of the region for `world` ranks (control blocks, then two halves of `world`
// slots and one wire-word area each, then the broadcast's stream).
std::size_t shm_region_bytes(int world);
// Why the region for `world` ranks does not fit where a host has `room` bytes free for shared
// memory (HostLayout::host_shm_room; kShmRoomUnknown fits anything), or nothing: what keeps
// `auto` from shm and hierarchical there.
std::optional<std::string> shm_region_misfit(int world, std::uint64_t room);

struct ShmOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // every wait's bound
  // When given, for each rank of the region the rank it is called in errors (its rank in a
  // larger run of which these ranks are one host's share); every rank passes the same list.
  std::vector<int> rank_names;
  // The ranks outnumber the CPUs they run on (HostLayout::shares_cores()): a wait yields the
  // CPU at once instead of spinning first, the allgather keeps to the slots (this rank votes
  // against single copy) and copies a rank's own block in one go rather than a piece at a time
  // while it waits, and a broadcast of more than 256 KiB goes in step through syncs rather
  // than as a stream. The same on every rank of the region (checked when it is made).
  bool shared_cores = false;
  // Where the system lets the ranks read one another's memory, a large allgather copies each
  // block straight from its owner's input (Note [Reading another rank's memory] in
  // shm_collectives.cpp). False on any rank turns that off for every rank of the region.
  bool single_copy = true;
};

class ShmCollectives {
 public:
  // `region` is a mapping of shm_region_bytes(world) bytes, the same region in every rank,
  // starting on a page, zero-filled when created. Every rank constructs its ShmCollectives
  // before any calls a collective (the backend's setup makes sure of it through the store).
  ShmCollectives(void* region, int rank, int world, ShmOptions options);
  // The others read this object's probe word through its address.
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  int rank() const { return rank_; }
  int size() const { return world_; }

  // The same arguments and results as asio-ring with its ring algorithm (comm.algorithm:
  // ring), to the bit: each element is reduced in the order the ring reduces it (see the
  // note), and a reduced-precision wire rounds where the ring's does.
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, DType wire);
  // `in` holds size() blocks of `count` elements; `out` gets the reduction of this rank's.
  // `in` and `out` must not overlap. The bits of asio-ring's ring reduce-scatter.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      DType wire);
  void broadcast(void* data, std::size_t bytes, int root);
  void allgather(const void* in, void* out, std::size_t bytes_per_rank);
  void barrier();
  // Whether the last collective was an allgather that read the others' blocks straight from
  // their processes.
  bool last_was_single_copy() const { return sequence_ != 0 && single_copy_sequence_ == sequence_; }

  // The same, for ranks that wait on a root busy with work of its own bounded by `extra`
  // (a host leader in its collective across hosts): their first wait may last the timeout
  // plus `extra`, so that the root's own failure, which it reports through mark_failed(),
  // reaches them before their patience ends.
  void broadcast(void* data, std::size_t bytes, int root, std::chrono::milliseconds extra);
  void barrier(std::chrono::milliseconds extra);

  // This rank failed because of rank `blamed` (a name, as in rank_names, possibly of a rank
  // outside this region): every other rank's current or next wait on this one ends with
  // PeerError(blamed). This communicator is broken from here on.
  void mark_failed(int blamed);

 private:
  struct Call;  // what a collective is, so that ranks that disagree fail with a message
  // allreduce() of data reduced in its own type on a wire of that type (Note [Shared-memory
  // collectives] in shm_collectives.cpp).
  void allreduce_direct(const Call& call, std::uint8_t* data, std::size_t count, DType type,
                        ReduceOp op);
  // reduce_scatter() of data reduced in its own type on a wire of that type.
  void reduce_scatter_direct(const Call& call, const std::uint8_t* source, std::uint8_t* target,
                             std::size_t count, DType type, ReduceOp op);
  // Whether every rank can read every other's memory and none declines; the first large
  // allgather asks, with two syncs.
  bool agree_on_single_copy(const Call& call);
  // The allgather in one copy; false where a rank's read failed, and then every rank runs the
  // call again through the slots.
  bool allgather_single_copy(const Call& call, const std::uint8_t* source, std::uint8_t* target,
                             std::size_t bytes_per_rank);
  void sync(const Call& call, int phase,
            std::chrono::milliseconds extra = std::chrono::milliseconds(0));
  // Enters the next sync (publishing the call first when it is the call's first) and returns
  // the count every rank must reach; sync() waits for it, a broadcast's stream later.
  std::uint64_t arrive(const Call& call, bool first);
  int name_of(int rank) const { return rank_names_.empty() ? rank : rank_names_[rank]; }
  void check_peers(const Call& call, int phase);
  void check_peer(const Call& call, int rank);  // what `rank` called is this call
  // Waits until missing() returns -1; until then it returns the rank waited for, which the
  // wait names when it fails. Bounded by the timeout plus `extra`.
  template <typename Missing>
  void wait_for(const Call& call, std::chrono::milliseconds extra, Missing&& missing);
  // The first rank that has not entered sync `target`, or -1.
  int first_not_arrived(std::uint64_t target) const;
  std::uint8_t* slot(int half, int rank) const;
  std::uint16_t* words(int half) const;
  std::uint8_t* stream_area() const;  // the broadcast's ring of pieces

  std::uint8_t* region_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::vector<int> rank_names_;
  std::uint64_t syncs_ = 0;      // syncs this rank has entered
  std::uint64_t sequence_ = 0;   // collectives called
  int half_ = 0;                 // the half the next piece uses
  std::uint64_t streamed_ = 0;   // pieces of all broadcasts so far
  std::size_t stream_next_ = 0;  // the stream's piece after the last broadcast's
  bool shared_cores_ = false;
  bool broken_ = false;
  enum class SingleCopy : std::uint8_t { unknown, yes, no };
  SingleCopy single_copy_ = SingleCopy::unknown;
  bool single_copy_allowed_ = true;         // this rank's ShmOptions::single_copy
  std::uint64_t single_copy_sequence_ = 0;  // the last allgather that took the single copy
  std::uint64_t probe_word_ = 0;            // what the others read to find out whether they can
};

}  // namespace partrain::comm
