// model.torchscript without Python: TorchScript modules defined here (torch::jit::Module with
// compiled methods), saved, and loaded as partrain loads a Python one. The mirror holds the
// module's own tensors under its names, follows to() and train(), a buffer the forward updates
// in place moves in both views, DataParallel (on CPU "devices") gives the whole batch's
// gradients, and every bad module is refused with a UsageError naming what is wrong.
#include "trainer/model/torchscript_model.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "trainer/parallel/data_parallel.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
namespace jit = torch::jit;

// Images [N, 1, 2, 2], 3 classes.
const ModelShape kShape{1, 2, 3, 2};

jit::Module new_module(const std::string& name) {
  jit::Module m(name);
  m.register_attribute("training", c10::BoolType::get(), true);
  return m;
}

// A linear layer over the flattened image, as a child module "fc" with a buffer that counts
// training forwards; the parent scales the logits by a parameter of its own.
jit::Module make_good(int classes = 3, const std::string& parent_forward = "") {
  jit::Module fc = new_module("Linear");
  fc.register_parameter("weight", torch::randn({4, classes}).requires_grad_(), false);
  fc.register_parameter("bias", torch::zeros({classes}).requires_grad_(), false);
  fc.register_buffer("seen", torch::zeros({}, torch::kLong));
  fc.define(R"(
def forward(self, x):
    if self.training:
        self.seen.add_(1)
    return torch.matmul(x, self.weight) + self.bias
)");
  jit::Module net = new_module("Net");
  net.register_module("fc", fc);
  net.register_parameter("scale", torch::ones({1}).requires_grad_(), false);
  net.define(parent_forward.empty() ? R"(
def forward(self, x):
    return self.fc.forward(torch.flatten(x, 1)) * self.scale
)"
                                    : parent_forward);
  return net;
}

class TorchScriptModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("partrain_ts_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    torch::manual_seed(1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const jit::Module& m, const std::string& name) {
    const std::string path = (dir_ / (name + ".pt")).string();
    m.save(path);
    return path;
  }

  // The message of the UsageError loading `path` raises, or "" when it loads.
  std::string refusal(const std::string& path) {
    try {
      load_torchscript_model(path, kShape);
    } catch (const UsageError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
      EXPECT_EQ(message.rfind(path, 0), 0u) << "does not start with the file: " << message;
      return message;
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(TorchScriptModel, MirrorHoldsTheModulesOwnTensorsUnderItsNames) {
  jit::Module original = make_good();
  const std::string path = save(original, "good");
  auto model = load_torchscript_model(path, kShape);
  auto& module = model->module();
  EXPECT_EQ(module.named_parameters().keys(),
            (std::vector<std::string>{"scale", "fc.weight", "fc.bias"}));
  EXPECT_EQ(module.named_buffers().keys(), (std::vector<std::string>{"fc.seen"}));
  // The probe ran on a copy: the loaded buffer is as saved.
  EXPECT_EQ(module.named_buffers()["fc.seen"].item<int64_t>(), 0);

  // Nor has it left gradients behind.
  for (const auto& p : module.parameters()) EXPECT_FALSE(p.grad().defined());
  const auto x = torch::randn({5, 1, 2, 2});
  auto out = model->forward(x);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{5, 3}));
  // The forward's in-place update and an optimizer's step are seen through the mirror.
  EXPECT_EQ(module.named_buffers()["fc.seen"].item<int64_t>(), 1);
  out.sum().backward();
  const auto weight = module.named_parameters()["fc.weight"];
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(
      torch::allclose(weight.grad(), torch::flatten(x, 1).sum(0).unsqueeze(1).expand({4, 3})));
  {
    torch::NoGradGuard no_grad;
    module.named_parameters()["scale"].fill_(2.0);
  }
  EXPECT_TRUE(torch::allclose(model->forward(x), out.detach() * 2, 1e-5, 1e-6));

  // eval() reaches the compiled forward's `training` flags: no counting.
  module.eval();
  model->forward(x);
  EXPECT_EQ(module.named_buffers()["fc.seen"].item<int64_t>(), 2);
  module.train();
  model->forward(x);
  EXPECT_EQ(module.named_buffers()["fc.seen"].item<int64_t>(), 3);

  // to() changes the tensors in place (set_data), so the module computes in the new type.
  module.to(torch::kDouble);
  EXPECT_EQ(module.named_parameters()["fc.weight"].scalar_type(), torch::kDouble);
  EXPECT_EQ(model->forward(x.to(torch::kDouble)).scalar_type(), torch::kDouble);
}

TEST_F(TorchScriptModel, DataParallelOverCpuDevicesGivesTheWholeBatchsGradients) {
  const std::string path = save(make_good(), "dp");
  auto model = load_torchscript_model(path, kShape);
  auto twin = load_torchscript_model(path, kShape);
  const std::vector<c10::Device> devices{torch::kCPU, torch::kCPU, torch::kCPU};
  const auto x = torch::randn({7, 1, 2, 2});  // pieces of 3, 3, 1
  const auto y = torch::tensor({0, 1, 2, 0, 1, 2, 0});
  auto split = data_parallel_forward(*model, x, devices, torch::kCPU);
  auto whole = twin->forward(x);
  EXPECT_TRUE(torch::allclose(split, whole, 1e-5, 1e-6));
  torch::nn::functional::cross_entropy(split, y).backward();
  torch::nn::functional::cross_entropy(whole, y).backward();
  const auto ours = model->module().named_parameters();
  const auto theirs = twin->module().named_parameters();
  for (const auto& item : ours) {
    SCOPED_TRACE(item.key());
    EXPECT_TRUE(item.value().is_leaf());
    ASSERT_TRUE(item.value().grad().defined());
    EXPECT_TRUE(torch::allclose(item.value().grad(), theirs[item.key()].grad(), 1e-5, 1e-6));
  }
  // Only the module itself (device 0's piece) advances its buffers; the replicas' are dropped.
  EXPECT_EQ(model->module().named_buffers()["fc.seen"].item<int64_t>(), 1);
}

TEST_F(TorchScriptModel, BadModulesAreRefusedSayingWhy) {
  EXPECT_NE(refusal((dir_ / "missing.pt").string()).find("no such file"), std::string::npos);
  {
    std::ofstream((dir_ / "text.pt").string()) << "not a model";
    EXPECT_NE(refusal((dir_ / "text.pt").string()).find("not a TorchScript file"),
              std::string::npos);
  }
  {
    jit::Module empty = new_module("Empty");
    empty.define("def forward(self, x):\n    return torch.zeros([x.size(0), 3])\n");
    EXPECT_NE(refusal(save(empty, "empty")).find("no parameters"), std::string::npos);
  }
  EXPECT_NE(refusal(save(make_good(5), "classes")).find("to [3, 5]; expected logits [3, 3]"),
            std::string::npos);
  EXPECT_NE(
      refusal(save(make_good(3, "def forward(self, x):\n    return x * self.scale\n"), "rank"))
          .find("to [3, 1, 2, 2]; expected logits [3, 3]"),
      std::string::npos);
  EXPECT_NE(refusal(save(make_good(3,
                                   "def forward(self, x):\n"
                                   "    y = self.fc.forward(torch.flatten(x, 1))\n"
                                   "    return (y, y)\n"),
                         "tuple"))
                .find("returns Tuple"),
            std::string::npos);
  const std::string throwing = refusal(
      save(make_good(3, "def forward(self, x):\n    return self.fc.forward(x)\n"), "throws"));
  EXPECT_NE(throwing.find("forward fails on a batch [3, 1, 2, 2]"), std::string::npos) << throwing;
  EXPECT_NE(refusal(save(make_good(3,
                                   "def forward(self, x):\n"
                                   "    y = self.fc.forward(torch.flatten(x, 1))\n"
                                   "    return y.detach()\n"),
                         "detached"))
                .find("does not depend on any of its parameters"),
            std::string::npos);
  {
    jit::Module rebinds =
        make_good(3,
                  "def forward(self, x):\n"
                  "    self.scale = self.scale * 1.0\n"
                  "    return self.fc.forward(torch.flatten(x, 1)) * self.scale\n");
    EXPECT_NE(refusal(save(rebinds, "rebinds")).find("replaces scale with a new tensor"),
              std::string::npos);
  }
  // And a good one loads.
  EXPECT_EQ(refusal(save(make_good(), "fine")), "");
}

}  // namespace
}  // namespace partrain
