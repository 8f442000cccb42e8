// Model shapes and structure: DigitalNet exactly as docs/architecture.md draws it.
#include "trainer/model/models.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace partrain {
namespace {

int64_t count_parameters(torch::nn::Sequential& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(Models, OutputShapes) {
  for (const ModelName name : {ModelName::kDigitalNet, ModelName::kResnet18, ModelName::kMlp}) {
    ModelConfig c;
    c.name = name;
    c.width = 8;
    auto m = make_model(c, ModelShape{3, 32, 100});
    auto out = m->forward(torch::randn({5, 3, 32, 32}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 100})) << name_of(name);
  }
  ModelConfig c;
  auto gray = make_model(c, ModelShape{1, 28, 10});
  EXPECT_EQ(gray->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  // Images that are wider than tall (an image folder kept at its own size).
  for (const ModelName name : {ModelName::kDigitalNet, ModelName::kMlp}) {
    c.name = name;
    c.width = 4;
    auto wide = make_model(c, ModelShape{3, 8, 4, 12});
    EXPECT_EQ(wide->forward(torch::randn({2, 3, 8, 12})).sizes(), (std::vector<int64_t>{2, 4}))
        << name_of(name);
  }
}

TEST(Models, DigitalNetLayersAsDesigned) {
  ModelConfig c;
  c.width = 4;
  auto m = make_model(c, ModelShape{3, 32, 100});
  // conv(3->4), conv(4->8), conv(8->16), conv(16->32), all 3x3 without bias; BN of 4+8+16+32
  // channels (weight+bias); Linear(32->100).
  const int64_t convs = 9 * (3 * 4 + 4 * 8 + 8 * 16 + 16 * 32);
  const int64_t bns = 2 * (4 + 8 + 16 + 32);
  const int64_t fc = 32 * 100 + 100;
  EXPECT_EQ(count_parameters(m), convs + bns + fc);
  auto params = m->named_parameters();
  EXPECT_TRUE(params.contains("conv1.weight"));
  EXPECT_TRUE(params.contains("bn4.bias"));
  EXPECT_TRUE(params.contains("fc.weight"));
  EXPECT_FALSE(params.contains("conv1.bias"));

  c.norm = Norm::kNone;
  auto plain = make_model(c, ModelShape{3, 32, 100});
  EXPECT_EQ(count_parameters(plain), convs + 9 * 0 + (4 + 8 + 16 + 32) + fc);  // conv biases
  for (const auto& child : plain->named_children()) {
    EXPECT_EQ(child.key().rfind("bn", 0), std::string::npos) << child.key();
  }
}

TEST(Models, SameSeedSameWeights) {
  ModelConfig c;
  torch::manual_seed(3);
  auto a = make_model(c, ModelShape{});
  torch::manual_seed(3);
  auto b = make_model(c, ModelShape{});
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

}  // namespace
}  // namespace partrain
