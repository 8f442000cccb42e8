// defines: the fuzz targets' bodies (fuzz_config, fuzz_idx, fuzz_cifar, fuzz_image, fuzz_ring,
// fuzz_store, fuzz_layout), kFuzzTargets, and InvariantBroken.
//
// Each body feeds one input to a parser of untrusted bytes. The contract it checks: the input
// is either accepted or refused with a partrain::UsageError (bodies let that one through);
// anything else — another exception, a crash, a sanitizer report, an endless loop, a huge
// allocation — is a bug. Bodies also throw InvariantBroken when a parser's answer contradicts
// what the input says. The same bodies run under libFuzzer (fuzz/libfuzzer_entry.cpp) and in
// the normal build, replaying saved inputs (tests/regression).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace partrain::fuzz {

class InvariantBroken : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// YAML text -> load_config (through a scratch file).
void fuzz_config(const std::uint8_t* data, std::size_t size);
// u16 split | u8 limit | images file bytes | labels file bytes -> read_idx_dataset.
void fuzz_idx(const std::uint8_t* data, std::size_t size);
// CIFAR-100 binary file bytes -> read_cifar100_bin.
void fuzz_cifar(const std::uint8_t* data, std::size_t size);
// u8 image_size (0: kept) | an image file's bytes -> read_image_folder of a folder holding it.
void fuzz_image(const std::uint8_t* data, std::size_t size);
// Bytes arriving on a ring port: handshake check and token, then a frame header; also the
// "host:port" text a rank publishes in the store.
void fuzz_ring(const std::uint8_t* data, std::size_t size);
// Bytes arriving on a tcp store port: hello, token, then requests served on a table.
void fuzz_store(const std::uint8_t* data, std::size_t size);
// u8 world - 1 | the host layout's value as rank 0 publishes it -> decode_host_layout.
void fuzz_layout(const std::uint8_t* data, std::size_t size);

struct FuzzTarget {
  const char* name;
  void (*run)(const std::uint8_t* data, std::size_t size);
};
inline constexpr FuzzTarget kFuzzTargets[] = {
    {"config", fuzz_config}, {"idx", fuzz_idx},     {"cifar", fuzz_cifar},   {"image", fuzz_image},
    {"ring", fuzz_ring},     {"store", fuzz_store}, {"layout", fuzz_layout},
};

}  // namespace partrain::fuzz
