#include "trainer/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/errors.h"
#include "trainer/data/counter_rng.h"

namespace partrain::data {

namespace {

constexpr double kPi = 3.141592653589793;
constexpr double kGratingAmplitude = 0.15;  // [0, 1] pixel units
constexpr double kColourJitter = 0.04;      // per image and channel, uniform +-
constexpr double kPixelNoise = 0.12;        // per pixel, standard deviation

// Class c's colour is a point of a 5 x 5 x 4 grid (classes beyond 100 wrap around, and
// extra channels reuse the pattern); its grating has one of 4 orientations and 3
// frequencies, chosen so that classes adjacent on the colour grid (c +- 1, 5, 25) always
// differ in orientation.
double class_colour(int c, int channel) {
  const int steps[3] = {5, 5, 4};
  const int strides[3] = {1, 5, 25};
  const int k = channel % 3;
  const int level = (c / strides[k]) % steps[k];
  return 0.15 + 0.7 * level / (steps[k] - 1);
}
double class_orientation(int c) { return (c % 4) * kPi / 4; }
double class_frequency(int c) { return 2.0 + 2.0 * ((c / 4) % 3); }  // cycles per image

// Roughly standard normal from one 64-bit draw: a sum of four 16-bit uniforms (Irwin-Hall,
// variance 4/12), much cheaper than Box-Muller and plenty for image noise.
double cheap_normal(CounterRng& rng) {
  const std::uint64_t bits = rng.next_u64();
  double sum = 0.0;
  for (int k = 0; k < 4; ++k) sum += static_cast<double>((bits >> (16 * k)) & 0xFFFF);
  return (sum / 65536.0 - 2.0) * 1.7320508075688772;  // / sqrt(1/3)
}

}  // namespace

ImageDataset generate_synthetic(const SyntheticOptions& o) {
  PARTRAIN_CHECK(o.size > 0, UsageError, "synthetic dataset size must be positive, not ", o.size);
  PARTRAIN_CHECK(o.num_classes >= 2 && o.num_classes <= 1000, UsageError,
                 "synthetic num_classes must be in 2..1000, not ", o.num_classes);
  PARTRAIN_CHECK(o.channels >= 1 && o.channels <= 4 && o.height >= 4 && o.width >= 4 &&
                     o.height <= 1024 && o.width <= 1024,
                 UsageError, "synthetic image shape ", o.channels, "x", o.height, "x", o.width,
                 " is outside 1..4 x 4..1024 x 4..1024");
  const std::uint64_t sample_bytes = std::uint64_t(o.channels) * o.height * o.width;
  PARTRAIN_CHECK(static_cast<std::uint64_t>(o.size) <= kMaxDatasetBytes / sample_bytes, UsageError,
                 "synthetic dataset of ", o.size, " samples of ", sample_bytes,
                 " bytes exceeds the ", kMaxDatasetBytes, " bytes held in memory");

  ImageDataset out;
  out.name = "synthetic";
  out.split = o.train ? "train" : "test";
  out.size = o.size;
  out.channels = o.channels;
  out.height = o.height;
  out.width = o.width;
  out.num_classes = o.num_classes;
  out.pixels.resize(static_cast<std::size_t>(o.size) * sample_bytes);
  out.labels.resize(static_cast<std::size_t>(o.size));

  const std::uint64_t split = o.train ? 1 : 2;
  std::vector<int> order(static_cast<std::size_t>(o.num_classes));
  std::vector<double> grating(static_cast<std::size_t>(o.height) * o.width);
  for (std::int64_t i = 0; i < o.size; ++i) {
    // Labels: each block of num_classes consecutive samples is one shuffle of the classes.
    const std::int64_t slot = i % o.num_classes;
    if (slot == 0) {
      std::iota(order.begin(), order.end(), 0);
      CounterRng shuffle(mix_seed(o.seed, split, 0x1abe1, i / o.num_classes));
      for (std::size_t k = order.size() - 1; k > 0; --k) {
        std::swap(order[k], order[shuffle.below(static_cast<std::uint32_t>(k + 1))]);
      }
    }
    const int c = order[static_cast<std::size_t>(slot)];
    out.labels[static_cast<std::size_t>(i)] = c;

    CounterRng rng(mix_seed(o.seed, split, 0x1a6e, static_cast<std::uint64_t>(i)));
    const double phase = 2 * kPi * rng.uniform();
    const double theta = class_orientation(c);
    const double cycles = class_frequency(c);
    const double kx = 2 * kPi * cycles * std::cos(theta) / o.width;
    const double ky = 2 * kPi * cycles * std::sin(theta) / o.height;
    for (int y = 0; y < o.height; ++y) {
      for (int x = 0; x < o.width; ++x) {
        grating[static_cast<std::size_t>(y) * o.width + x] =
            kGratingAmplitude * std::sin(kx * x + ky * y + phase);
      }
    }
    std::uint8_t* image = out.pixels.data() + static_cast<std::size_t>(i) * sample_bytes;
    for (int ch = 0; ch < o.channels; ++ch) {
      const double base = class_colour(c, ch) + kColourJitter * (2 * rng.uniform() - 1);
      std::uint8_t* plane = image + static_cast<std::size_t>(ch) * o.height * o.width;
      for (std::size_t p = 0; p < grating.size(); ++p) {
        const double v = base + grating[p] + kPixelNoise * cheap_normal(rng);
        plane[p] = static_cast<std::uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0));
      }
    }
  }
  compute_channel_stats(out, out.mean, out.std);
  return out;
}

}  // namespace partrain::data
