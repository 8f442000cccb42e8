// Note [PowerSGD]
// ---------------
// On a slow link the gradient allreduce costs more than the step's computation. PowerSGD
// (Vogels, Karimireddy and Jaggi, 2019) sends, for each weight matrix, two thin factors of a
// rank-r approximation of it instead: r * (rows + cols) numbers instead of rows * cols. A
// parameter of shape [n, d1, d2, ...] is the matrix n x (d1 * d2 * ...), as the paper does for
// convolutions. Per bucket of a sync step, for each matrix, with M this rank's (scaled)
// gradient, E its error buffer and Q the factor of the previous step:
//
//   M <- M + E                        error feedback: what earlier steps failed to send
//   P <- M Q                          rows x r
//   allreduce P                       one collective: every matrix's P, packed with the
//                                     bucket's uncompressed parameters
//   P^ <- orthonormal basis of P      QR, the same on every rank (same P in, same P^ out)
//   Q <- M^T P^                       cols x r
//   allreduce Q                       one collective: every matrix's Q
//   approx <- P^ Q^T                  the sum's projection onto P^: the same on every rank
//   E <- M - scale * approx           what this rank owes the sum, still to be sent
//   M <- approx
//
// Summed over the ranks, the E's are (sum of M) - approx, the part of the sum not yet sent,
// whatever each rank's scale; at full rank (r = min(rows, cols)) approx is the sum itself and
// nothing is owed. Every collective above sums over the ranks something linear in a rank's
// M (after its E is added), so what is sent depends on the ranks' M + E only through their
// sum: a checkpoint resumed at another world size splits the sum of the E's evenly over the
// new ranks and goes on as the uninterrupted run would. Q carries over to the next step
// ("warm start", one power iteration per step); a column of Q that came out zero (a matrix
// whose gradient was zero) keeps its previous value, since a zero column would stay zero ever
// after. The first factors are drawn from a generator seeded alike on every rank.
//
// Not every parameter is worth it: vectors (biases, norm weights) and matrices whose factors
// are no smaller than themselves go uncompressed, in the first collective. The first
// start_step sync steps are plain allreduces of the whole bucket, as in the paper's warm-up:
// the gradients change fastest at the start.
//
// The arithmetic runs on the gradients' device, on the communication thread; on CUDA it
// queues on that thread's current stream, the legacy default stream where the buckets were
// written, so it is ordered after them, and its collectives take the plain path of
// allreduce_tensor() (each returns once its result is in the tensor).
#include "trainer/parallel/powersgd.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <algorithm>

#include "comm_backends/communicator.h"
#include "common/errors.h"

namespace partrain {

PowerSgd::PowerSgd(PowerSgdOptions options, comm::Communicator& comm,
                   const std::vector<BucketContents>& buckets,
                   const c10::TensorOptions& tensor_options)
    : options_(options), comm_(comm) {
  PARTRAIN_CHECK(options_.rank >= 1, Error, "PowerSGD needs a rank of at least 1");
  const auto dtype = c10::typeMetaToScalarType(tensor_options.dtype());
  PARTRAIN_CHECK(dtype == at::kFloat || dtype == at::kDouble, UsageError,
                 "PowerSGD compresses f32 or f64 gradients, not ", c10::toString(dtype));
  element_bytes_ = tensor_options.dtype().itemsize();
  const c10::TensorOptions on_device = tensor_options.requires_grad(false);
  at::Generator generator = at::detail::createCPUGenerator(options_.seed);
  for (const BucketContents& contents : buckets) {
    BucketPlan plan;
    for (std::size_t i = 0; i < contents.shapes.size(); ++i) {
      const std::vector<std::int64_t>& shape = contents.shapes[i];
      std::int64_t numel = 1;
      for (std::int64_t d : shape) numel *= d;
      plan.elements += numel;
      Matrix x;
      x.offset = contents.offsets[i];
      x.rows = shape.size() >= 2 ? shape[0] : 0;
      x.cols = x.rows > 0 ? numel / x.rows : 0;
      x.rank = std::min<std::int64_t>({options_.rank, x.rows, x.cols});
      const bool smaller = x.rank * (x.rows + x.cols) < numel;
      if (x.rank == 0 || (!smaller && !options_.compress_every_matrix)) {
        plan.plain.emplace_back(contents.offsets[i], numel);
        plan.plain_elements += numel;
        continue;
      }
      x.q = at::randn({x.cols, x.rank}, generator, at::TensorOptions().dtype(at::kFloat))
                .to(on_device);
      x.error = at::zeros({x.rows, x.cols}, on_device);
      plan.p_elements += x.rows * x.rank;
      plan.q_elements += x.cols * x.rank;
      plan.matrices.push_back(std::move(x));
    }
    plans_.push_back(std::move(plan));
  }
}

PowerSgd::~PowerSgd() = default;

std::int64_t PowerSgd::reduce(std::size_t bucket, const at::Tensor& flat, float scale,
                              const StreamOrder& order) {
  BucketPlan& plan = plans_.at(bucket);
  if (steps_ < options_.start_step || plan.matrices.empty()) {
    allreduce_tensor(comm_, flat, comm::ReduceOp::sum, order);
    return flat.numel() * static_cast<std::int64_t>(flat.element_size());
  }
  return compress(plan, flat, scale);
}

std::int64_t PowerSgd::compress(BucketPlan& plan, const at::Tensor& flat, float scale) {
  at::NoGradGuard no_grad;
  // The uncompressed parameters, then each matrix's P: one buffer, one collective.
  at::Tensor first = at::empty({plan.plain_elements + plan.p_elements}, flat.options());
  std::int64_t pos = 0;
  for (const auto& [offset, count] : plan.plain) {
    first.narrow(0, pos, count).copy_(flat.narrow(0, offset, count));
    pos += count;
  }
  std::vector<at::Tensor> ms, ps;
  for (Matrix& x : plan.matrices) {
    at::Tensor m = flat.narrow(0, x.offset, x.rows * x.cols).view({x.rows, x.cols});
    if (options_.error_feedback) m.add_(x.error);
    at::Tensor p = first.narrow(0, pos, x.rows * x.rank).view({x.rows, x.rank});
    at::mm_out(p, m, x.q);
    pos += x.rows * x.rank;
    ms.push_back(m);
    ps.push_back(p);
  }
  allreduce_tensor(comm_, first, comm::ReduceOp::sum);
  pos = 0;
  for (const auto& [offset, count] : plan.plain) {
    flat.narrow(0, offset, count).copy_(first.narrow(0, pos, count));
    pos += count;
  }

  at::Tensor second = at::empty({plan.q_elements}, flat.options());
  std::vector<at::Tensor> bases;
  pos = 0;
  for (std::size_t i = 0; i < plan.matrices.size(); ++i) {
    const Matrix& x = plan.matrices[i];
    // Householder QR gives orthonormal columns even when P is rank-deficient.
    bases.push_back(std::get<0>(at::linalg_qr(ps[i])));
    at::Tensor q = second.narrow(0, pos, x.cols * x.rank).view({x.cols, x.rank});
    at::mm_out(q, ms[i].t(), bases[i]);
    pos += x.cols * x.rank;
  }
  allreduce_tensor(comm_, second, comm::ReduceOp::sum);

  pos = 0;
  for (std::size_t i = 0; i < plan.matrices.size(); ++i) {
    Matrix& x = plan.matrices[i];
    at::Tensor q = second.narrow(0, pos, x.cols * x.rank).view({x.cols, x.rank});
    pos += x.cols * x.rank;
    at::Tensor approx = at::mm(bases[i], q.t());
    if (options_.error_feedback) at::sub_out(x.error, ms[i], approx, scale);
    ms[i].copy_(approx);
    x.q = at::where(q.norm(2, {0}, /*keepdim=*/true) > 0, q, x.q);
  }
  return (first.numel() + second.numel()) * static_cast<std::int64_t>(flat.element_size());
}

std::size_t PowerSgd::compressed_matrices() const {
  std::size_t n = 0;
  for (const auto& plan : plans_) n += plan.matrices.size();
  return n;
}

std::uint64_t PowerSgd::bytes_per_step() const {
  std::uint64_t elements = 0;
  for (const auto& plan : plans_) {
    elements += static_cast<std::uint64_t>(
        plan.matrices.empty() ? plan.elements
                              : plan.plain_elements + plan.p_elements + plan.q_elements);
  }
  return elements * element_bytes_;
}

std::uint64_t PowerSgd::uncompressed_bytes_per_step() const {
  std::uint64_t elements = 0;
  for (const auto& plan : plans_) elements += static_cast<std::uint64_t>(plan.elements);
  return elements * element_bytes_;
}

std::int64_t PowerSgd::error_elements() const {
  std::int64_t n = 0;
  for (const auto& plan : plans_) {
    for (const Matrix& x : plan.matrices) n += x.rows * x.cols;
  }
  return n;
}

std::int64_t PowerSgd::q_elements() const {
  std::int64_t n = 0;
  for (const auto& plan : plans_) n += plan.q_elements;
  return n;
}

// The checkpoint holds rank 0's factors (every rank holds the same) and every rank's error
// buffers, gathered into one [world size, elements] tensor: one file, written by rank 0 as
// atomically as the rest of the checkpoint, from which each rank takes its own row.
c10::IValue PowerSgd::save() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> errors, qs;
  for (const auto& plan : plans_) {
    for (const Matrix& x : plan.matrices) {
      errors.push_back(x.error.reshape(-1));
      qs.push_back(x.q.reshape(-1));
    }
  }
  const std::int64_t world = comm_.size();
  const std::int64_t n = error_elements();
  at::Tensor mine = errors.empty() ? at::empty({0}) : at::cat(errors);
  at::Tensor all = mine;
  if (world > 1 && n > 0) {
    all = at::empty({world * n}, mine.options());
    allgather_tensor(comm_, mine, all);
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rank", static_cast<std::int64_t>(options_.rank));
  dict.insert("steps", steps_);
  dict.insert("q", qs.empty() ? at::empty({0}) : at::cat(qs).cpu());
  dict.insert("error", all.reshape({world, n}).cpu());
  return dict;
}

void PowerSgd::load(const c10::IValue& saved, const std::string& path) {
  auto unreadable = [&](const char* what) {
    return UsageError(detail::concat("checkpoint ", path, ": its PowerSGD state ", what));
  };
  if (!saved.isGenericDict()) throw unreadable("is not readable");
  const auto dict = saved.toGenericDict();
  for (const char* key : {"rank", "steps", "q", "error"}) {
    if (!dict.contains(key)) throw unreadable("has no entry 'rank', 'steps', 'q' or 'error'");
  }
  const std::int64_t rank = dict.at("rank").toInt();
  PARTRAIN_CHECK(rank == options_.rank, UsageError, "checkpoint ", path,
                 " holds PowerSGD factors of rank ", rank, " and this run has comm.powersgd_rank ",
                 options_.rank, "; use the same rank, or checkpoint.resume: never to start afresh");
  const at::Tensor q = dict.at("q").toTensor();
  const at::Tensor error = dict.at("error").toTensor();
  const std::int64_t world = comm_.size();
  if (q.numel() != q_elements() || error.dim() != 2 || error.size(0) < 1 ||
      error.size(1) != error_elements()) {
    throw unreadable("does not fit this model");
  }
  at::NoGradGuard no_grad;
  // Written by a run of another world size (a resume in global-batch mode): what is owed is the
  // sum of the error buffers, and everything PowerSGD sends depends on the ranks' buffers only
  // through that sum, so each rank of this run takes an equal part of it.
  const at::Tensor mine =
      error.size(0) == world ? error[comm_.rank()] : error.sum(0).div_(static_cast<double>(world));
  std::int64_t at_q = 0, at_error = 0;
  for (auto& plan : plans_) {
    for (Matrix& x : plan.matrices) {
      x.q.copy_(q.narrow(0, at_q, x.cols * x.rank).view({x.cols, x.rank}));
      x.error.copy_(mine.narrow(0, at_error, x.rows * x.cols).view({x.rows, x.cols}));
      at_q += x.cols * x.rank;
      at_error += x.rows * x.cols;
    }
  }
  steps_ = dict.at("steps").toInt();
}

std::int64_t PowerSgd::memory_bytes() const {
  return (error_elements() + q_elements()) * static_cast<std::int64_t>(element_bytes_);
}

}  // namespace partrain
