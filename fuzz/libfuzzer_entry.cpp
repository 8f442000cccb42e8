// libFuzzer's entry point for one target, chosen at compile time (PARTRAIN_FUZZ_TARGET). A
// UsageError is the promised answer to bad input; everything else escapes and is reported.
#include <cstddef>
#include <cstdint>

#include "common/errors.h"
#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    PARTRAIN_FUZZ_TARGET(data, size);
  } catch (const partrain::UsageError&) {
  }
  return 0;
}
