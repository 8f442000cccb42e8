// defines: BucketCaps, BucketLayout, assign_buckets() — which of DDP's gradient buckets each
// parameter goes to, and where in it (Note [Reducer] in reducer.cpp). LibTorch-free: it sees
// element counts, not tensors, so its rule is tested on its own.
#pragma once

#include <cstddef>
#include <vector>

namespace partrain {

// The caps of the buckets, in MiB (ReducerOptions holds them).
struct BucketCaps {
  double bucket_mb = 0;
  double first_bucket_mb = 0;  // bucket 0 only; the smaller of the two caps applies there
};

// One bucket: its parameters laid end to end, in the order listed.
struct BucketLayout {
  std::vector<std::size_t> params;   // parameter indices
  std::vector<std::size_t> offsets;  // elements from the bucket's start, one per parameter
  std::size_t elements = 0;          // the bucket's length
};

// Lays parameters with `element_counts[k]` elements of `element_bytes` bytes each into
// buckets, in reverse order of k (roughly the order autograd produces their gradients).
// A bucket closes when adding the next parameter would take it past its cap (at least one
// element); a parameter larger than the cap gets a bucket of its own. The buckets come in
// launch order.
std::vector<BucketLayout> assign_buckets(const std::vector<std::size_t>& element_counts,
                                         std::size_t element_bytes, const BucketCaps& caps);

}  // namespace partrain
