#include "comm_backends/checked_communicator.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/backends/peer_process.h"
#include "comm_backends/flight_recorder.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

namespace {

// Whether two buffers share no byte.
bool apart(const Buffer& x, const Buffer& y) {
  const auto* a = static_cast<const std::uint8_t*>(x.data);
  const auto* b = static_cast<const std::uint8_t*>(y.data);
  return a + x.bytes() <= b || b + y.bytes() <= a;
}

}  // namespace

CheckedCommunicator::CheckedCommunicator(std::unique_ptr<Communicator> backend, Store& store,
                                         std::string prefix, std::int64_t instance,
                                         std::chrono::milliseconds timeout)
    : backend_(std::move(backend)),
      store_(store),
      prefix_(std::move(prefix)),
      instance_(instance),
      timeout_(timeout),
      rank_(backend_->rank()),
      size_(backend_->size()),
      name_(backend_->name()),
      capabilities_(backend_->capabilities()) {}

void CheckedCommunicator::check_buffer(const Buffer& buffer, const char* what) const {
  if (buffer.device == DeviceKind::cuda) {
    PARTRAIN_CHECK(capabilities_.device_memory, UsageError, "comm backend '", name_,
                   "' works on CPU buffers; use nccl (Linux with CUDA) for CUDA buffers");
  } else {
    PARTRAIN_CHECK(capabilities_.host_memory, UsageError, "comm backend '", name_,
                   "' works on CUDA buffers; use asio-ring or gloo for CPU");
  }
  PARTRAIN_CHECK(buffer.count == 0 || buffer.data != nullptr, UsageError, what,
                 " on a null buffer of ", buffer.count, " elements");
}

template <typename Collective>
void CheckedCommunicator::run(CollectiveKind kind, std::size_t bytes, Collective&& collective) {
  std::lock_guard<std::mutex> lock(mutex_);
  PARTRAIN_CHECK(failure_.empty(), CommError, name_, ": broken by an earlier failure (", failure_,
                 "); create a new communicator");
  const std::uint64_t seq = ++calls_;
  const std::uint64_t order =
      flight_recorder().begin(static_cast<int>(instance_), seq, kind, bytes);
  try {
    collective();
  } catch (const PeerError& e) {
    failure_ = e.what();
    trace_and_rethrow(e);
  } catch (const CommError& e) {
    failure_ = e.what();
    throw;
  }
  last_algorithm_ = backend_->last_algorithm();
  flight_recorder().end(order, last_algorithm_);
}

// Only the peers of a dead or silent rank see it go; the others see their own peer fail. So
// the rank reports whom it blames and follows the other ranks' reports to the one that sent
// none (failure_trace.h); a backend that could not tell whom it lost (peer -1) is named the
// rank that reports nothing.
void CheckedCommunicator::trace_and_rethrow(const PeerError& lost) {
  const std::chrono::milliseconds grace = failure_grace(timeout_);
  const FailureTrace trace = trace_failed_rank(store_, prefix_ + "trace/", rank_, size_,
                                               lost.peer_rank(), grace, timeout_);
  // The store went during the trace, so the blame could be followed no further. Where its
  // server, a rank of this machine, has ended or is stopped, that rank went first, unless its
  // own report was read: then it was a survivor that has left since, as survivors do.
  const std::optional<ServingRankSeen> serving =
      trace.store_lost ? serving_rank_gone(store_) : std::nullopt;
  if (serving && serving->rank != lost.peer_rank() &&
      std::find(trace.heard.begin(), trace.heard.end(), serving->rank) == trace.heard.end()) {
    throw PeerError(serving->rank, name_ + ": rank " + std::to_string(serving->rank) +
                                       " failed first (it served the store, which no longer "
                                       "answers); here: " +
                                       lost.what() + "; " + serving->sentence);
  }
  // The rank named, where it stopped on an error of its own, said why before it went; one that
  // was killed or froze said nothing, but where it shares this machine its process shows which
  // (peer_process.h).
  const std::optional<std::string> why =
      trace.culprit >= 0 ? why_rank_stopped(store_, trace.culprit, grace) : std::nullopt;
  // The serving rank was watched already where it is the one named.
  const std::optional<std::string> seen = trace.culprit < 0 || why ? std::nullopt
                                          : serving && serving->rank == trace.culprit
                                              ? std::optional(serving->sentence)
                                              : look_at_rank_process(store_, trace.culprit, grace);
  const std::string reason = why ? "; " + *why : seen ? "; " + *seen : "";
  if (lost.peer_rank() >= 0) {
    if (trace.culprit < 0) throw;  // the one caught
    if (trace.culprit == lost.peer_rank()) {
      if (reason.empty()) throw;
      // The reason itself in place of the words that point to it.
      std::string told = lost.what();
      if (why && told.ends_with(kItsOwnOutputSaysWhy)) {
        told.resize(told.size() - std::string_view(kItsOwnOutputSaysWhy).size());
      }
      throw PeerError(trace.culprit, told + reason);
    }
    throw PeerError(trace.culprit,
                    name_ + ": rank " + std::to_string(trace.culprit) +
                        " failed first (traced through the other ranks' reports); here: " +
                        lost.what() + reason);
  }
  if (trace.culprit < 0) throw CommError(lost.what());
  std::string whom = trace.silent.size() > 1 ? "ranks" : "rank";
  if (trace.silent.empty()) whom += " " + std::to_string(trace.culprit);
  for (std::size_t i = 0; i < trace.silent.size(); ++i) {
    whom += (i == 0 ? " " : ", ") + std::to_string(trace.silent[i]);
  }
  throw PeerError(trace.culprit, std::string(lost.what()) + " (lost " + whom + ")" + reason);
}

void CheckedCommunicator::allreduce(Buffer buffer, ReduceOp op) {
  check_buffer(buffer, "allreduce");
  run(CollectiveKind::allreduce, buffer.bytes(), [&] { backend_->allreduce(buffer, op); });
}

void CheckedCommunicator::reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) {
  check_buffer(in, "reduce_scatter");
  check_buffer(out, "reduce_scatter");
  PARTRAIN_CHECK(in.dtype == out.dtype, UsageError, "reduce_scatter: input is ",
                 dtype_name(in.dtype), " but output is ", dtype_name(out.dtype));
  PARTRAIN_CHECK(in.device == out.device, UsageError,
                 "reduce_scatter: input and output in different memories");
  PARTRAIN_CHECK_EQ(in.count, out.count * static_cast<std::size_t>(size_), UsageError,
                    "reduce_scatter: the input's element count is not ", size_, " x ", out.count);
  PARTRAIN_CHECK(out.count == 0 || apart(in, out), UsageError,
                 "reduce_scatter: the output overlaps the input");
  run(CollectiveKind::reduce_scatter, in.bytes(), [&] { backend_->reduce_scatter(in, out, op); });
}

void CheckedCommunicator::broadcast(Buffer buffer, int root) {
  check_buffer(buffer, "broadcast");
  PARTRAIN_CHECK(root >= 0 && root < size_, UsageError, "broadcast: root ", root,
                 " is outside a world of ", size_);
  run(CollectiveKind::broadcast, buffer.bytes(), [&] { backend_->broadcast(buffer, root); });
}

void CheckedCommunicator::allgather(const Buffer& in, Buffer out) {
  check_buffer(in, "allgather");
  check_buffer(out, "allgather");
  PARTRAIN_CHECK(in.dtype == out.dtype, UsageError, "allgather: input is ", dtype_name(in.dtype),
                 " but output is ", dtype_name(out.dtype));
  PARTRAIN_CHECK(in.device == out.device, UsageError,
                 "allgather: input and output in different memories");
  PARTRAIN_CHECK_EQ(out.count, in.count * static_cast<std::size_t>(size_), UsageError,
                    "allgather: the output's element count is not ", size_, " x ", in.count);
  const bool own_block = in.data == static_cast<const std::uint8_t*>(out.data) + rank_ * in.bytes();
  PARTRAIN_CHECK(in.count == 0 || own_block || apart(in, out), UsageError,
                 "allgather: the input overlaps the output but is not this rank's block");
  run(CollectiveKind::allgather, out.bytes(), [&] { backend_->allgather(in, out); });
}

void CheckedCommunicator::barrier() {
  run(CollectiveKind::barrier, 0, [&] { backend_->barrier(); });
}

std::string CheckedCommunicator::last_algorithm() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_algorithm_;
}

std::uint64_t CheckedCommunicator::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

// The composed reduce-scatter, for communicators that have none of their own.
void Communicator::reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) {
  PARTRAIN_CHECK(in.device == DeviceKind::cpu && out.device == DeviceKind::cpu, UsageError,
                 "comm backend '", name(), "' has no reduce_scatter of CUDA buffers");
  PARTRAIN_CHECK_EQ(in.count, out.count * static_cast<std::size_t>(size()), UsageError,
                    "reduce_scatter: the input's element count is not ", size(), " x ", out.count);
  std::vector<std::uint8_t> copy(in.bytes());
  if (!copy.empty()) std::memcpy(copy.data(), in.data, copy.size());
  Buffer all = in;
  all.data = copy.data();
  allreduce(all, op);
  if (out.count > 0) {
    std::memcpy(out.data, copy.data() + static_cast<std::size_t>(rank()) * out.bytes(),
                out.bytes());
  }
}

}  // namespace partrain::comm
