// defines: kExitStopped and StopRequest — a worker's side of a polite stop: SIGTERM, SIGINT
// or SIGUSR1 (POSIX; SIGTERM and SIGINT on Windows) only set a flag, the training loop looks
// at it after each optimizer step, the ranks agree to stop at that step, save it and exit
// with kExitStopped. No LibTorch.
#pragma once

namespace partrain {

// The exit code of a rank (and of `partrain run`) that stopped at a signal after saving a
// checkpoint of the step it reached: running the same command again continues from there.
// 75 is EX_TEMPFAIL of sysexits.h, "try again later", distinct from 1 (failed) and 2 (bad
// input), so a batch script can requeue on it.
inline constexpr int kExitStopped = 75;

// While one lives, the stop signals are recorded instead of ending the process; the previous
// handlers come back on destruction. One at a time.
//
// A further signal ends the process at once, by that signal (its default action), when it
// comes while the stop's checkpoint is being written (set_saving), or more than
// kRepeatWindowSeconds after the first: a signal sent twice on purpose means "now". Inside the
// window it counts as the same request, since one stop often arrives by two paths (Slurm
// signals every process of a step, and the launcher forwards its own signal too). An end in
// the middle of a save is harmless: checkpoints are written to a temp name and renamed.
class StopRequest {
 public:
  static constexpr double kRepeatWindowSeconds = 2.0;

  StopRequest();
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // Whether a stop signal came, and which (0: none). Also answers with no StopRequest alive.
  static bool requested();
  static int signal();
  // "SIGTERM" and so on; "a stop request" for 0.
  static const char* signal_name(int signal);
  // Around the stop's checkpoint: a signal meanwhile ends the process at once.
  static void set_saving(bool saving);
};

}  // namespace partrain
