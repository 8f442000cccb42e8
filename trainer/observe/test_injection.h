// defines: InjectedFaults and injected_faults() — distortions the tests of the breakdown, the
// trace and the straggler verdict ask for through the environment, so that they can check the
// figures against a known cause. Unset (as in every real run), they are zero. LibTorch-free.
//
//   PARTRAIN_TEST_CLOCK_SKEW=RANK:SECONDS   rank RANK's clock reads SECONDS ahead
//   PARTRAIN_TEST_STEP_DELAY=RANK:SECONDS   rank RANK waits SECONDS before each batch (as a
//                                           slow input pipeline would), so it arrives late
#pragma once

namespace partrain {

struct InjectedFaults {
  double clock_skew_s = 0;
  double step_delay_s = 0;
};

// This rank's share of the variables above; a malformed value is a UsageError naming it.
InjectedFaults injected_faults(int rank);

}  // namespace partrain
