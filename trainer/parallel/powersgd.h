// defines: PowerSgd — PowerSGD low-rank gradient compression (Vogels et al., 2019) as the
// Reducer's bucket reduction, with error feedback; its checkpoint state (key "powersgd") and
// the bytes it sends. See Note [PowerSGD] in powersgd.cpp.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/parallel/bucket_reduction.h"

namespace c10 {
struct IValue;
}

namespace partrain {

namespace comm {
class Communicator;
}

struct PowerSgdOptions {
  int rank = 2;                  // of the factors (comm.powersgd_rank)
  std::int64_t start_step = 10;  // sync steps of plain allreduce first (comm.powersgd_start_step)
  std::uint64_t seed = 0;        // draws the first factors, the same on every rank
  // For tests only. error_feedback false drops what the approximation missed instead of
  // carrying it into the next step; compress_every_matrix true compresses also the matrices
  // whose factors are no smaller than the matrix (at full rank, PowerSGD must then be exact).
  bool error_feedback = true;
  bool compress_every_matrix = false;
};

class PowerSgd final : public BucketReduction {
 public:
  // `buckets`: the Reducer's layout (Reducer::bucket_contents()); `tensor_options`: the
  // gradients' dtype (f32 or f64) and device. The same on every rank.
  PowerSgd(PowerSgdOptions options, comm::Communicator& comm,
           const std::vector<BucketContents>& buckets, const c10::TensorOptions& tensor_options);
  ~PowerSgd() override;

  std::int64_t reduce(std::size_t bucket, const at::Tensor& flat, float scale,
                      const StreamOrder& order) override;
  void end_step() override { ++steps_; }

  // Its checkpoint state (the strategy's entry "powersgd"): the factors Q, every rank's error
  // buffers (gathered: a collective, on every rank) and the step count.
  c10::IValue save();
  // On every rank, with the value save() returned on rank 0. Throws UsageError naming `path`
  // when it does not fit this run.
  void load(const c10::IValue& saved, const std::string& path);

  std::int64_t steps() const { return steps_; }  // sync steps reduced so far
  std::size_t compressed_matrices() const;
  // Bytes each rank hands to the allreduces of one sync step once compressing, and without.
  std::uint64_t bytes_per_step() const;
  std::uint64_t uncompressed_bytes_per_step() const;
  // Bytes it keeps between steps: the factors Q and the error buffers.
  std::int64_t memory_bytes() const;

 private:
  // A parameter compressed as a rows x cols matrix (its first dimension by the rest).
  struct Matrix {
    std::int64_t offset = 0;  // elements into the bucket's flat tensor
    std::int64_t rows = 0, cols = 0, rank = 0;
    at::Tensor q;      // cols x rank: the last step's factor, the next step's start
    at::Tensor error;  // rows x cols: what this rank still owes the sum
  };
  struct BucketPlan {
    std::vector<Matrix> matrices;
    std::vector<std::pair<std::int64_t, std::int64_t>> plain;  // (offset, count), uncompressed
    std::int64_t elements = 0;                                 // of the whole bucket
    std::int64_t plain_elements = 0;                           // sum of the plain counts
    std::int64_t p_elements = 0;                               // sum of rows x rank
    std::int64_t q_elements = 0;                               // sum of cols x rank
  };

  // Returns the bytes handed to the two allreduces.
  std::int64_t compress(BucketPlan& plan, const at::Tensor& flat, float scale);
  std::int64_t error_elements() const;
  std::int64_t q_elements() const;

  PowerSgdOptions options_;
  comm::Communicator& comm_;
  std::vector<BucketPlan> plans_;
  std::size_t element_bytes_ = 4;
  std::int64_t steps_ = 0;
};

}  // namespace partrain
