// defines: put_le() / get_le() — unsigned integers as little-endian bytes, the byte order of
// every partrain wire format (ring handshake and frames, tcp store messages), whatever the
// machine's own order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace partrain {

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
