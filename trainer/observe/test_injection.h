// defines: InjectedFaults and injected_faults() — distortions the tests of the breakdown, the
// trace, the straggler verdict and the stop ask for through the environment, so that they can
// check the figures against a known cause. Unset (as in every real run), they are zero.
// LibTorch-free.
//
//   PARTRAIN_TEST_CLOCK_SKEW=RANK:SECONDS   rank RANK's clock reads SECONDS ahead
//   PARTRAIN_TEST_STEP_DELAY=RANK:SECONDS   rank RANK waits SECONDS before each batch (as a
//                                           slow input pipeline would), so it arrives late
//   PARTRAIN_TEST_STOP_SAVE_DELAY=RANK:SECONDS  rank RANK, writing the checkpoint of a stop,
//                                           waits SECONDS between the temp file and its rename
//                                           (as a slow disk would), so a test can signal it
//                                           in the middle of the save
#pragma once

namespace partrain {

struct InjectedFaults {
  double clock_skew_s = 0;
  double step_delay_s = 0;
  double stop_save_delay_s = 0;
};

// This rank's share of the variables above; a malformed value is a UsageError naming it.
InjectedFaults injected_faults(int rank);

}  // namespace partrain
