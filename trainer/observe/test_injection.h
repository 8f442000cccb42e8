// defines: InjectedFaults, SaveFault, injected_faults() and die_at_once() — distortions the
// tests of the breakdown, the trace, the straggler verdict, the stop, the checkpoint save and
// data.balance auto ask for through the environment, so that they can check the figures against
// a known cause.
// Test-only: unset (as in every real run), they are zero. LibTorch-free.
//
//   PARTRAIN_TEST_CLOCK_SKEW=RANK:SECONDS   rank RANK's clock reads SECONDS ahead
//   PARTRAIN_TEST_STEP_DELAY=RANK:SECONDS   rank RANK waits SECONDS before each batch (as a
//                                           slow input pipeline would), so it arrives late
//   PARTRAIN_TEST_SAMPLE_DELAY=RANK:SECONDS rank RANK waits SECONDS per sample of each batch
//                                           inside its forward (as a slower device would), so
//                                           data.balance auto measures it slower
//   PARTRAIN_TEST_STOP_SAVE_DELAY=RANK:SECONDS  rank RANK, writing the checkpoint of a stop,
//                                           waits SECONDS between the temp file and its rename
//                                           (as a slow disk would), so a test can signal it
//                                           in the middle of the save
//   PARTRAIN_TEST_SAVE_FAULT=RANK:PHASE[:N]  rank RANK kills itself with SIGKILL (no cleanup,
//                                           as a power cut would end it) in its Nth checkpoint
//                                           save (default 1) at PHASE, one of the save's steps
//                                           (SaveFault::Phase), so a test can check what that
//                                           leaves on disk and that the run resumes from it
//   PARTRAIN_TEST_START_DELAY=RANK:SECONDS  rank RANK waits SECONDS at the end of its
//                                           start-up (as a slow data load would), the others
//                                           already at their first step, and says so on
//                                           stderr, so a test can stop the run there
//   PARTRAIN_TEST_OWN_DISK=RANK:1           rank RANK resumes as a rank on a host of its own
//                                           would: it does not see rank 0's checkpoint file,
//                                           so rank 0 sends it the bytes
#pragma once

namespace partrain {

// Where in a checkpoint save (Checkpointer::write_checkpoint) the process dies.
struct SaveFault {
  enum class Phase {
    kNone,
    kBefore,    // "before": entering the save, nothing written
    kWrite,     // "write": the temp file holds half the checkpoint
    kRename,    // "rename": the temp file whole and synced, not yet renamed
    kManifest,  // "manifest": the checkpoint renamed, latest.json not yet naming it
    kPrune,     // "prune": latest.json names it, the checkpoints beyond keep not yet removed
  };
  Phase phase = Phase::kNone;
  int save = 1;  // which save of this process, counted from 1

  bool strikes(Phase at, int this_save) const { return phase == at && save == this_save; }
};

struct InjectedFaults {
  double clock_skew_s = 0;
  double step_delay_s = 0;
  double sample_delay_s = 0;
  double stop_save_delay_s = 0;
  double start_delay_s = 0;
  SaveFault save_fault;
  bool own_disk = false;
};

// This rank's share of the variables above; a malformed value is a UsageError naming it.
InjectedFaults injected_faults(int rank);

// Ends this process at once by SIGKILL (on Windows, TerminateProcess): no destructor, no
// flush, no handler runs.
[[noreturn]] void die_at_once();

}  // namespace partrain
