// defines: put_le() / get_le() — unsigned integers as little-endian bytes, the byte order of
// every partrain wire format (ring handshake and frames, tcp store messages), whatever the
// machine's own order — and bytes_as_text(), a byte buffer read as text without a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

namespace partrain {

// `bytes` as characters, for as long as `bytes` lives.
inline std::string_view bytes_as_text(const std::vector<std::uint8_t>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

template <typename UInt>
void put_le(void* out, UInt value) {
  static_assert(std::is_unsigned_v<UInt>);
  auto* bytes = static_cast<std::uint8_t*>(out);
  for (std::size_t i = 0; i < sizeof(UInt); ++i) {
    bytes[i] = static_cast<std::uint8_t>(value >> (8 * i));
  }
}

template <typename UInt>
UInt get_le(const void* in) {
  static_assert(std::is_unsigned_v<UInt>);
  const auto* bytes = static_cast<const std::uint8_t*>(in);
  UInt value = 0;
  for (std::size_t i = 0; i < sizeof(UInt); ++i) value |= UInt{bytes[i]} << (8 * i);
  return value;
}

}  // namespace partrain
