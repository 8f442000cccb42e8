// defines: mix_seed() and CounterRng — the random numbers of the data layer (shuffling,
// synthetic images, augmentation).
//
// Every random stream is keyed by what it is for — (seed, epoch) for a permutation,
// (seed, split, sample) for a synthetic image, (seed, epoch, sample) for a crop — so the
// result does not depend on thread count, world size or the order samples are visited.
// The generator is SplitMix64 and the bounded draw is written out here rather than taken
// from <random>, whose distributions differ between standard libraries: a seed gives the
// same data on Linux and Windows.
#pragma once

#include <cstdint>

namespace partrain::data {

// SplitMix64's finaliser: a bijection on 64 bits with full avalanche.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One 64-bit key from several, order-sensitive (mix_seed(a, b) != mix_seed(b, a)).
inline std::uint64_t mix_seed(std::uint64_t a) { return mix64(a); }
template <typename... Rest>
std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, Rest... rest) {
  return mix_seed(mix64(a) ^ (b + 0x632BE59BD9B4E019ull), static_cast<std::uint64_t>(rest)...);
}

class CounterRng {
 public:
  explicit CounterRng(std::uint64_t key) : state_(key) {}

  std::uint64_t next_u64() {
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound), 0 < bound < 2^32, without modulo bias (Lemire's multiply-and-
  // reject on 32-bit halves, so it needs no 128-bit type and ports to MSVC).
  std::uint32_t below(std::uint32_t bound) {
    std::uint64_t m = (next_u64() >> 32) * bound;
    auto low = static_cast<std::uint32_t>(m);
    if (low < bound) {
      const std::uint32_t threshold = (0u - bound) % bound;
      while (low < threshold) {
        m = (next_u64() >> 32) * bound;
        low = static_cast<std::uint32_t>(m);
      }
    }
    return static_cast<std::uint32_t>(m >> 32);
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

}  // namespace partrain::data
