// defines: make_model() — digitalnet, resnet18 (CIFAR variant) and mlp as torch::nn::Sequential.
//
// Every model is a Sequential with named children, so that one type serves DDP, DataParallel
// (which needs a Cloneable module) and checkpoints (parameter names like "conv1.weight").
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <functional>

#include "trainer/config/config.h"

namespace partrain {

struct ModelShape {
  int in_channels = 3;
  int image_size = 32;  // height
  int num_classes = 100;
  int image_width = 0;  // 0: square (image_size); image folders and tensor files need not be
};

// The normalisation layer after a convolution with `channels` outputs, wherever a model has
// one (norm: batch), including those inside resnet18's blocks. Unset: BatchNorm2d.
// model.sync_batchnorm passes SyncBatchNorm2d's (sync_batchnorm.h).
using NormLayer = std::function<torch::nn::AnyModule(int channels)>;

torch::nn::Sequential make_model(const ModelConfig& config, const ModelShape& shape,
                                 const NormLayer& norm = nullptr);

}  // namespace partrain
