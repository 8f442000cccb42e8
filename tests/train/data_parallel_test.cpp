// DataParallel on CPU "devices": the replica scheme does not depend on the device type, so
// what it keeps, computes and sends back is checked here; tests/gpu runs the same checks
// on CUDA devices.
#include "common/errors.h"
#include "tests/train/data_parallel_checks.h"

namespace partrain {
namespace {

using namespace dp_checks;

const std::vector<torch::Device> kTwoCpus{torch::kCPU, torch::kCPU};
const std::vector<torch::Device> kThreeCpus{torch::kCPU, torch::kCPU, torch::kCPU};

TEST(DataParallel, KeepsTheBatchNormStatisticsOfDeviceZero) {
  expect_batchnorm_statistics_kept(kTwoCpus, 1e-6);
  expect_batchnorm_statistics_kept(kThreeCpus, 1e-6);
}

TEST(DataParallel, GradientsOfEveryReplicaReachTheModel) {
  expect_gradients_of_every_replica(kTwoCpus, 1e-5);
  expect_gradients_of_every_replica(kThreeCpus, 1e-5);
}

// data.balance under strategy dp: pieces in proportion to the weights (5 rows as 4 and 1 for
// 3:1); a device whose piece rounds to 0 sits the batch out, device 0 included (1:1:100 gives
// the third device all 7 rows), and the gradients still reach the model.
TEST(DataParallel, WeightedPiecesGiveTheGradientsOfTheWholeBatch) {
  expect_gradients_of_every_replica(kTwoCpus, 1e-5, {3, 1});
  expect_gradients_of_every_replica(kThreeCpus, 1e-5, {1, 1, 100});
  expect_gradients_of_every_replica(kThreeCpus, 1e-5, {0.5, 2, 1});
  auto net = make_net(Norm::kNone, torch::kCPU);
  EXPECT_THROW(data_parallel_forward(*net, images(4, torch::kCPU), kTwoCpus, torch::kCPU, {1}),
               Error);
}

TEST(DataParallel, EvaluationMatchesTheModel) {
  expect_evaluation_matches_the_model(kTwoCpus, 1e-6);
}

TEST(DataParallel, OneDeviceIsThePlainForward) {
  auto net = make_net(Norm::kBatch, torch::kCPU);
  auto twin = copy_of(net);
  const auto x = images(4, torch::kCPU);
  EXPECT_TRUE(
      close(data_parallel_forward(*net, x, {torch::kCPU}, torch::kCPU), twin->forward(x), 0));
  // The copy numbers its children, so its buffers are compared by position.
  const auto kept = net->buffers();
  const auto want = twin->buffers();
  ASSERT_EQ(kept.size(), want.size());
  for (std::size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(close(kept[i], want[i], 0)) << i;
}

TEST(DataParallel, RefusesAModelOffTheFirstDevice) {
  auto net = make_net(Norm::kNone, torch::kCPU);
  const std::vector<torch::Device> devices{torch::Device(torch::kCUDA, 0), torch::kCPU};
  EXPECT_THROW(data_parallel_forward(*net, images(2, torch::kCPU), devices, torch::kCPU), Error);
}

}  // namespace
}  // namespace partrain
