// defines: kExitStopped and StopRequest — a worker's side of a polite stop: SIGTERM, SIGINT
// or SIGUSR1 (POSIX; SIGTERM, SIGINT and SIGBREAK, which is CTRL_BREAK_EVENT, on Windows). During
// the start-up one ends the rank at once; from the first step on it only sets a flag, the training
// loop looks at it after each optimizer step, the ranks agree to stop at that step, save it and
// exit with kExitStopped. No LibTorch.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace partrain {

// The exit code of a rank (and of `partrain run`) that stopped at a signal after saving a
// checkpoint of the step it reached: running the same command again continues from there.
// 75 is EX_TEMPFAIL of sysexits.h, "try again later", distinct from 1 (failed) and 2 (bad
// input), so a batch script can requeue on it.
inline constexpr int kExitStopped = 75;

// While one lives, the stop signals are recorded instead of ending the process; the previous
// handlers come back on destruction. One at a time.
//
// Made `in_start_up`, it first ends the process at a stop signal, until steps_begin(): one
// line on stderr (format_start_up_stop_line(), common/worker_lines.h), then exit
// kExitStopped, with no destructor run. Before the first step there is nothing to save, and a
// start-up phase (a download, a data load, a wait for a rank that never comes) can take
// minutes that a stop should not wait out, nor a launcher's grace end with SIGKILL. Files are
// written to a temp name and renamed, so an exit in the middle of one leaves no half file.
// Stdout should be line-buffered (a pipe is not by default; Windows has no line buffering, so
// unbuffered there): the exit flushes nothing, since flushing is not safe in a signal handler,
// nor on the thread Windows runs the handler on while the main thread may hold stdout.
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

  explicit StopRequest(bool in_start_up = false);
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
  // The first training step is about to run: from here a stop signal is a request (above).
  static void steps_begin();
  // Made in_start_up, and steps_begin() not called yet.
  static bool in_start_up();

  // In the start-up, once there are others to tell (the ranks have met): a stop signal calls
  // `tell` with why ("SIGTERM before its first step") before the process ends, so that the
  // others, which see this rank leave, can say why. It gets at most kStartUpTellBound; the
  // process then ends all the same, wherever the tell stands. POSIX calls it on a thread of
  // its own that the handler wakes through a pipe (a handler may only write); Windows on the
  // handler's thread. A second signal meanwhile ends the process at once. Once only, and only
  // in the start-up.
  static constexpr std::chrono::milliseconds kStartUpTellBound{1000};
  void tell_on_start_up_stop(std::function<void(const std::string&)> tell);
  // No more telling (steps_begin() and the destructor do it too): call it before what `tell`
  // uses goes. A stop already being told ends the process first.
  static void stop_telling();
};

}  // namespace partrain
