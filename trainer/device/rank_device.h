// defines: pick_device(), set_intra_op_threads() and data_parallel_devices() — where one rank
// computes: its CUDA device or the CPU, how many CPU threads it uses, and (strategy dp) the GPUs
// it spreads each batch over.
#pragma once

#include <c10/core/Device.h>

#include <vector>

#include "common/rank_place.h"
#include "trainer/config/config.h"

namespace partrain {

// Selects the device before any other device work, so that the CUDA context is made there.
// Throws UsageError where the config asks for a device this machine lacks.
c10::Device pick_device(const Config& config, const RankPlace& place);

// train.threads, or the cores shared out between the ranks of this host.
void set_intra_op_threads(const Config& config, const RankPlace& place);

// strategy dp: every visible GPU; otherwise none.
std::vector<c10::Device> data_parallel_devices(const Config& config);

}  // namespace partrain
