// defines: generate_synthetic() — a seeded, CIFAR-shaped, learnable image set.
//
// Each class c owns a colour (a point of a 5x5x4 grid in RGB space) and a grating (an
// orientation and a spatial frequency); an image of class c is its colour plus its grating
// at a random phase, under per-image brightness jitter and per-pixel Gaussian noise. A small
// CNN separates the classes by colour and texture within an epoch, yet no single pixel
// gives the class away. Sample i of a split depends only on (seed, split, i).
#pragma once

#include <cstdint>

#include "trainer/data/dataset.h"

namespace partrain::data {

struct SyntheticOptions {
  std::int64_t size = 5000;
  bool train = true;  // the train and test splits are drawn from different streams
  int num_classes = 100;
  int channels = 3;
  int height = 32;
  int width = 32;
  std::uint64_t seed = 0;
};

// Labels cycle through the classes in a seeded shuffled order, so every class has
// size / num_classes samples (+1 for some) and any prefix is close to balanced.
// mean and std are measured on the generated images.
ImageDataset generate_synthetic(const SyntheticOptions& options);

}  // namespace partrain::data
