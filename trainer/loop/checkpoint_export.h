// defines: export_checkpoint() — `partrain export`: one checkpoint, a sharded run's included
// (its shard files beside it), written as one consolidated file in the format of an unsharded
// run's checkpoint, which Python's torch.load reads and partrain resumes from, and optionally
// the model's tensors in the safetensors format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace partrain {

struct ExportSummary {
  int shards = 0;                     // shard files read (0: the checkpoint was not sharded)
  std::size_t tensors = 0;            // of the model's state dict
  std::size_t optimizer_entries = 0;  // parameters with optimizer state
  std::uint64_t bytes = 0;            // of `out`
};

// Reads checkpoint `path` and, if a sharded run wrote it, every shard beside it; writes `out`
// atomically: {"format", "model", "optimizer": a whole state per parameter, "meta"} and any
// other entry of the checkpoint. With `safetensors` not empty, also the model's tensors there
// (safetensors' layout: an 8-byte little-endian header length, a JSON header giving each
// tensor's dtype, shape and byte range, then the tensors' bytes). Throws UsageError naming the
// file when something cannot be read or written.
ExportSummary export_checkpoint(const std::string& path, const std::string& out,
                                const std::string& safetensors);

}  // namespace partrain
