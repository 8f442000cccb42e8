#include "trainer/model/models.h"

#include <torch/nn.h>

#include "common/errors.h"

namespace partrain {
namespace {

namespace nn = torch::nn;

// ResNet basic block: two 3x3 convolutions with a shortcut (a 1x1 projection where the
// shape changes).
class BasicBlockImpl : public nn::Cloneable<BasicBlockImpl> {
 public:
  BasicBlockImpl(int in, int out, int stride, NormLayer norm)
      : in_(in), out_(out), stride_(stride), norm_(std::move(norm)) {
    reset();
  }

  void reset() override {
    conv1_ = register_module(
        "conv1",
        nn::Conv2d(nn::Conv2dOptions(in_, out_, 3).stride(stride_).padding(1).bias(!norm_)));
    conv2_ = register_module("conv2",
                             nn::Conv2d(nn::Conv2dOptions(out_, out_, 3).padding(1).bias(!norm_)));
    if (norm_) {
      bn1_ = norm_(out_);
      bn2_ = norm_(out_);
      register_module("bn1", bn1_.ptr());
      register_module("bn2", bn2_.ptr());
    }
    if (stride_ != 1 || in_ != out_) {
      nn::Sequential shortcut;
      shortcut->push_back("conv",
                          nn::Conv2d(nn::Conv2dOptions(in_, out_, 1).stride(stride_).bias(!norm_)));
      if (norm_) shortcut->push_back("bn", norm_(out_));
      shortcut_ = register_module("shortcut", shortcut);
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    auto y = conv1_(x);
    if (norm_) y = bn1_.forward(y);
    y = torch::relu(y);
    y = conv2_(y);
    if (norm_) y = bn2_.forward(y);
    auto shortcut = shortcut_ ? shortcut_->forward(x) : x;
    return torch::relu(y + shortcut);
  }

 private:
  int in_, out_, stride_;
  NormLayer norm_;  // unset: norm: none
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::AnyModule bn1_, bn2_;
  nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

// conv3x3 -> [BN] -> ReLU, the unit DigitalNet repeats.
void add_conv_unit(nn::Sequential& seq, int index, int in, int out, const NormLayer& norm) {
  std::string n = std::to_string(index);
  seq->push_back("conv" + n, nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(!norm)));
  if (norm) seq->push_back("bn" + n, norm(out));
  seq->push_back("relu" + n, nn::ReLU(nn::ReLUOptions().inplace(true)));
}

nn::Sequential make_digitalnet(int c, const NormLayer& bn, const ModelShape& s) {
  nn::Sequential seq;
  add_conv_unit(seq, 1, s.in_channels, c, bn);
  seq->push_back("pool1", nn::MaxPool2d(2));
  add_conv_unit(seq, 2, c, 2 * c, bn);
  seq->push_back("pool2", nn::MaxPool2d(2));
  add_conv_unit(seq, 3, 2 * c, 4 * c, bn);
  seq->push_back("pool3", nn::MaxPool2d(2));
  add_conv_unit(seq, 4, 4 * c, 8 * c, bn);
  seq->push_back("pool4", nn::AdaptiveAvgPool2d(1));
  seq->push_back("flatten", nn::Flatten());
  seq->push_back("fc", nn::Linear(8 * c, s.num_classes));
  return seq;
}

nn::Sequential make_resnet18(int c, const NormLayer& bn, const ModelShape& s) {
  nn::Sequential seq;
  seq->push_back("stem", nn::Conv2d(nn::Conv2dOptions(s.in_channels, c, 3).padding(1).bias(!bn)));
  if (bn) seq->push_back("stem_bn", bn(c));
  seq->push_back("stem_relu", nn::ReLU());
  int in = c;
  const int widths[4] = {c, 2 * c, 4 * c, 8 * c};
  for (int stage = 0; stage < 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      int stride = (stage > 0 && block == 0) ? 2 : 1;
      seq->push_back("layer" + std::to_string(stage + 1) + "_" + std::to_string(block),
                     BasicBlock(in, widths[stage], stride, bn));
      in = widths[stage];
    }
  }
  seq->push_back("pool", nn::AdaptiveAvgPool2d(1));
  seq->push_back("flatten", nn::Flatten());
  seq->push_back("fc", nn::Linear(in, s.num_classes));
  return seq;
}

nn::Sequential make_mlp(int width, const ModelShape& s) {
  nn::Sequential seq;
  seq->push_back("flatten", nn::Flatten());
  const int image_width = s.image_width > 0 ? s.image_width : s.image_size;
  seq->push_back("fc1", nn::Linear(s.in_channels * s.image_size * image_width, width));
  seq->push_back("relu1", nn::ReLU());
  seq->push_back("fc2", nn::Linear(width, s.num_classes));
  return seq;
}

}  // namespace

torch::nn::Sequential make_model(const ModelConfig& config, const ModelShape& shape,
                                 const NormLayer& norm) {
  NormLayer bn;
  if (config.norm == Norm::kBatch) {
    bn = norm ? norm : [](int channels) { return nn::AnyModule(nn::BatchNorm2d(channels)); };
  }
  switch (config.name) {
    case ModelName::kDigitalNet:
      return make_digitalnet(config.width, bn, shape);
    case ModelName::kResnet18:
      return make_resnet18(config.width, bn, shape);
    case ModelName::kMlp:
      return make_mlp(config.width, shape);
  }
  throw Error(
      detail::concat("model.name: no model for enumerator ", static_cast<int>(config.name)));
}

}  // namespace partrain
