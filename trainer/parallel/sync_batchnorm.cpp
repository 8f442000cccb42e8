// Note [SyncBatchNorm]
// --------------------
// W ranks at batch b with SyncBatchNorm compute what one process computes at batch W*b with
// BatchNorm: the same normalised outputs, running statistics and (after the Reducer averages
// them) gradients. Per channel c, over the N*H*W values of every rank:
//
//   forward:  allreduce [sum x, sum x^2, count]          -> mean, biased var, invstd
//             y = (x - mean) * invstd * weight + bias;     running stats from the global
//             mean and the unbiased global var
//   backward: allreduce [sum dy, sum dy*(x - mean)]      -> the input gradient
//             dx = (dy - sum dy / n - (x - mean) * invstd^2 * sum dy*(x - mean) / n)
//                  * invstd * weight
//             grad weight / bias from this rank's own sums: the Reducer averages them, as it
//             averages every parameter's gradient.
//
// Uneven shares (data.balance). Rank r holds n_r of the n values and its dy is the gradient of
// its own mean loss, which the Reducer later counts by n_r / n (Strategy::set_rank_share); the
// gradient of the mean loss over all samples is (n_r / n) dy on rank r. So each rank sends its
// backward sums times n_r / n, and divides what comes back by the same factor, to return dx in
// the scale of its own loss like every other layer. With even shares that is the formula above,
// which the layer keeps as it is.
//
// Sums travel in f64: var = E[x^2] - mean^2 loses digits in f32 when mean^2 >> var.
//
// Why a communicator of its own. The backward allreduce runs on the autograd thread while
// the Reducer's communication thread allreduces gradient buckets on the training
// communicator. comm::Communicator promises nothing about calls from two threads at once
// (asio-ring and shm keep one sequence counter and one set of connections per communicator;
// Gloo's context is not shared between threads either), and even a thread-safe one would
// pair up collectives by order: rank 0 might issue "bucket 3, BN 2" where rank 1 issues "BN 2,
// bucket 3", summing a gradient bucket with BatchNorm sums. So the loop makes a second
// communicator over the same store (make_communicator numbers instances per rank, which
// gives it its own key prefix and connections) and hands it to these layers alone. On it the
// order is the same on every rank: each rank runs the same graph, forward in layer order and
// backward in the autograd engine's order, which for one graph is fixed (one thread per
// device, nodes in sequence-number order).
#include "trainer/parallel/sync_batchnorm.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <cstdint>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the forward measured, for the running statistics (global, f64, per channel).
struct BatchStatistics {
  at::Tensor mean;
  at::Tensor var;  // biased
  double count = 0;
};

const std::vector<int64_t> kReduceDims{0, 2, 3};

at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {
  return v.to(like.scalar_type()).view({1, -1, 1, 1});
}

void sum_over_ranks(comm::Communicator* comm, at::Tensor& sums) {
  if (comm != nullptr && comm->size() > 1) allreduce_tensor(*comm, sums, comm::ReduceOp::sum);
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, comm::Communicator* comm, double eps,
                            BatchStatistics* stats) {
    const int64_t channels = x.size(1);
    const double local_count = static_cast<double>(x.numel() / channels);
    at::Tensor sums = at::cat({x.sum(kReduceDims, false, at::kDouble),
                               (x * x).sum(kReduceDims, false, at::kDouble),
                               at::full({1}, local_count, x.options().dtype(at::kDouble))})
                          .contiguous();
    sum_over_ranks(comm, sums);
    const double count = sums[2 * channels].item<double>();
    PARTRAIN_CHECK(count > 1, UsageError,
                   "SyncBatchNorm: expected more than 1 value per channel "
                   "over all ranks when training, got ",
                   count);
    at::Tensor mean = sums.narrow(0, 0, channels) / count;
    at::Tensor var = (sums.narrow(0, channels, channels) / count - mean * mean).clamp_min(0);
    at::Tensor invstd = (var + eps).rsqrt();

    at::Tensor scale = weight.defined() ? invstd * weight.to(at::kDouble) : invstd;
    at::Tensor y = (x - per_channel(mean, x)) * per_channel(scale, x);
    if (bias.defined()) y = y + per_channel(bias, x);

    ctx->save_for_backward({x, weight});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["invstd"] = invstd;
    ctx->saved_data["count"] = count;
    ctx->saved_data["local_count"] = local_count;
    ctx->saved_data["has_bias"] = bias.defined();
    // AutogradContext stores IValues only; the communicator outlives the graph (the model
    // holds it), so its address is kept as an integer.
    ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<std::intptr_t>(comm));
    stats->mean = mean;
    stats->var = var;
    stats->count = count;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor dy = grad_outputs[0].contiguous();
    const at::Tensor mean = ctx->saved_data["mean"].toTensor();
    const at::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    const double count = ctx->saved_data["count"].toDouble();
    auto* comm = reinterpret_cast<comm::Communicator*>(
        static_cast<std::intptr_t>(ctx->saved_data["comm"].toInt()));
    const double local_count = ctx->saved_data["local_count"].toDouble();
    const int world = comm != nullptr ? comm->size() : 1;
    // Even shares keep the sums as they are, and so the bits of an even run.
    const double share = local_count * world == count ? 1.0 : local_count / count;
    const int64_t channels = x.size(1);

    const at::Tensor xmu = x - per_channel(mean, x);
    at::Tensor sums = at::cat(
        {dy.sum(kReduceDims, false, at::kDouble), (dy * xmu).sum(kReduceDims, false, at::kDouble)});
    at::Tensor grad_weight, grad_bias;
    if (weight.defined())
      grad_weight = (sums.narrow(0, channels, channels) * invstd).to(weight.scalar_type());
    if (ctx->saved_data["has_bias"].toBool())
      grad_bias = sums.narrow(0, 0, channels).to(x.scalar_type());
    // The local sums are read above before the allreduce overwrites them.
    sums = share == 1.0 ? sums.clone() : sums * share;
    sum_over_ranks(comm, sums);
    const at::Tensor mean_dy = sums.narrow(0, 0, channels) / (count * share);
    const at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / (count * share);
    const at::Tensor scale = weight.defined() ? invstd * weight.to(at::kDouble) : invstd;
    at::Tensor dx =
        (dy - per_channel(mean_dy, x) - xmu * per_channel(invstd * invstd * mean_dy_xmu, x)) *
        per_channel(scale, x);
    return {dx, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& options,
                                         comm::Communicator* comm)
    : options_(options), comm_(comm) {
  reset();
}

void SyncBatchNorm2dImpl::reset() {
  PARTRAIN_CHECK(options_.track_running_stats(), Error,
                 "SyncBatchNorm2d keeps running statistics, as BatchNorm2d does by default");
  const int64_t c = options_.num_features();
  if (options_.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  }
  running_mean = register_buffer("running_mean", torch::zeros({c}));
  running_var = register_buffer("running_var", torch::ones({c}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

at::Tensor SyncBatchNorm2dImpl::forward(const at::Tensor& input) {
  PARTRAIN_CHECK(input.dim() == 4, Error, "SyncBatchNorm2d expects [N, C, H, W], got ",
                 input.sizes());
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, false, 0.0,
                             options_.eps(), at::globalContext().userEnabledCuDNN());
  }
  BatchStatistics stats;
  at::Tensor y = SyncBatchNormFunction::apply(input, weight, bias, comm_, options_.eps(), &stats);
  torch::NoGradGuard no_grad;
  num_batches_tracked.add_(1);
  const double factor = options_.momentum().has_value()
                            ? *options_.momentum()
                            : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  const at::Tensor unbiased = stats.var * (stats.count / (stats.count - 1));
  running_mean.mul_(1 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
  running_var.mul_(1 - factor).add_(unbiased.to(running_var.scalar_type()), factor);
  return y;
}

NormLayer sync_batchnorm_layers(comm::Communicator& comm) {
  return [&comm](int channels) {
    return torch::nn::AnyModule(SyncBatchNorm2d(torch::nn::BatchNormOptions(channels), &comm));
  };
}

}  // namespace partrain
