// defines: fnv1a_64(), fnv1a_64_of(), hex_128() and fnv1a_128_hex() — a small, stable hash (the
// same on every platform and build) for names derived from text: run-token directories, tokens
// that the nodes of a run agree on without talking; and for telling files apart.
#pragma once

#include <cstdint>
#include <cstdio>
#include <istream>
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;

constexpr std::uint64_t fnv1a_64(std::string_view text, std::uint64_t seed = kFnv1aOffset) {
  std::uint64_t hash = seed;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

// fnv1a_64() of the bytes `in` has left, read a MiB at a time (a file of any size in little
// memory).
inline std::uint64_t fnv1a_64_of(std::istream& in) {
  std::vector<char> chunk(1 << 20);
  std::uint64_t hash = kFnv1aOffset;
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    hash = fnv1a_64(std::string_view(chunk.data(), static_cast<std::size_t>(in.gcount())), hash);
  }
  return hash;
}

// 32 lowercase hex digits, high word first.
inline std::string hex_128(std::uint64_t high, std::uint64_t low) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return text;
}

// Two FNV-1a hashes with different offsets, as 32 hex digits: a token derived from text.
inline std::string fnv1a_128_hex(std::string_view text) {
  return hex_128(fnv1a_64(text), fnv1a_64(text, 0x84222325cbf29ce4ull));
}

}  // namespace partrain
