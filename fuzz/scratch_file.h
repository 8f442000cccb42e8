// defines: write_scratch_file() — the readers under test take paths, so inputs go through
// files in a per-process scratch directory (overwritten in place: no disk growth).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace partrain::fuzz {

// Writes the bytes to scratch file `name` (which may name folders, made as needed) and returns
// its path.
std::string write_scratch_file(const std::string& name, const std::uint8_t* data, std::size_t size);

}  // namespace partrain::fuzz
