// defines: fnv1a_64() — a small, stable hash (the same on every platform and build) for
// names derived from text: run-token directories, tokens agreed without talking.
#pragma once

#include <cstdint>
#include <string_view>

namespace partrain {

inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;

constexpr std::uint64_t fnv1a_64(std::string_view text, std::uint64_t seed = kFnv1aOffset) {
  std::uint64_t hash = seed;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

}  // namespace partrain
