// A stand-in for `partrain worker` in the launcher tests: prints progress lines the way a
// worker does, and fails, hangs or shrugs off the launcher's polite stop on request.
//
//   launcher_fake_worker [--epochs N] [--steps K] [--sleep-ms MS] [--spam N]
//       [--fail RANK:CODE:EPOCH] [--fail-until-restart R] [--kill-self RANK:EPOCH]
//       [--hang RANK|all] [--hang-ms MS] [--ready-file PATH] [--wait-for PATH]
//       [--failed-file PATH] [--ignore-sigterm]
//       [--print-env] [--long-line BYTES] [--spawn-child] [--stop-politely STEP] [--heartbeat]
//
// Always prints "pid P" and "restart R" first (R = PARTRAIN_RESTART). Per epoch E it prints
// "epoch E/N" and K step lines, plus one stderr line "warning from rank X in epoch E".
// --fail exits with CODE right after printing "epoch EPOCH/N" on rank RANK, but only while
// PARTRAIN_RESTART < R when --fail-until-restart R is given. --hang sleeps after the epochs
// (at most 30 s, then exits 99 so that a broken launcher cannot leak it for long); with
// --hang-ms it prints "stopped hanging by itself" after MS and exits 1, as a rank does that
// sees a peer's failure in a collective. With --failed-file the MS count from the moment PATH
// exists, which a rank failing on purpose (--fail, --kill-self) creates just before it ends:
// the peer's failure, however late a loaded machine starts that rank.
// A hanging rank creates --ready-file once it hangs (SIGTERM already ignored if asked); a
// rank about to fail or kill itself first waits up to 10 s for --wait-for, so tests know
// the other ranks are where they should be when the failure comes.
// --spam N prints N long lines in a burst (for the interleaving test); --long-line prints
// BYTES 'y's and no newline at all, last. --spawn-child first starts a copy of itself that
// hangs (output to the null device, so it holds no pipe of the launcher's) and prints
// "child pid P": something a worker started, which a stop of its group must reach too.
//
// --heartbeat beats as `partrain worker` does, every PARTRAIN_HEARTBEAT_S seconds.
// --stop-politely STEP answers a stop signal as `partrain worker` does: a hanging rank that
// gets one prints "partrain: stopped at step STEP by SIGNAL" and exits with kExitStopped.
//
// On Windows --ignore-sigterm ignores CTRL_BREAK_EVENT (the polite stop there), and
// --kill-self ends the process with STATUS_ACCESS_VIOLATION, the status a crash leaves:
// Windows has no SIGKILL, and a real crash might wait in a debugger or error dialog.
#include <boost/process.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_list.h"
#include "common/heartbeat.h"
#include "common/stop_request.h"
#include "common/worker_lines.h"

#ifdef _WIN32
// After Boost's headers, which need winsock2.h to come before windows.h.
#include <windows.h>
#endif

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

int arg_int(const std::string& text) { return std::stoi(text); }

#ifdef _WIN32
BOOL WINAPI swallow_ctrl_break(DWORD event) { return event == CTRL_BREAK_EVENT ? TRUE : FALSE; }
#endif

void ignore_polite_stop() {
#ifdef _WIN32
  ::SetConsoleCtrlHandler(swallow_ctrl_break, TRUE);
#else
  std::signal(SIGTERM, SIG_IGN);
#endif
}

[[noreturn]] void die_like_a_crash() {
#ifdef _WIN32
  ::TerminateProcess(::GetCurrentProcess(), 0xC0000005);  // STATUS_ACCESS_VIOLATION
#else
  std::raise(SIGKILL);
#endif
  std::abort();  // not reached
}

// The folder of a file:// store url: file:///tmp/x -> /tmp/x, file:///C:/x -> C:/x.
std::string file_url_path(const std::string& url) {
  const std::string rest = url.substr(7);
  if (rest.size() >= 3 && rest[0] == '/' && rest[2] == ':') return rest.substr(1);
  return rest;
}

// "a:b:c" -> the field at index i
int field(const std::string& spec, int index) {
  std::size_t start = 0;
  for (int i = 0; i < index; ++i) start = spec.find(':', start) + 1;
  return std::stoi(spec.substr(start, spec.find(':', start) - start));
}

void touch(const std::string& path) {
  if (!path.empty()) std::ofstream(path) << "failed\n";
}

void wait_for_file(const std::string& path) {
  if (path.empty()) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One stderr line in one write, as `partrain worker` writes its lines: the heartbeat thread
// (--heartbeat) writes on stderr too, and a line written piece by piece could take the
// heartbeat into its middle.
void error_line(const std::string& text) {
  const std::string line = text + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 2;
  int steps = 2;
  int sleep_ms = 0;
  int spam = 0;
  int long_line = 0;
  std::string fail;
  int fail_until_restart = -1;
  std::string kill_self;
  std::string hang;
  int hang_ms = -1;
  std::string ready_file;
  std::string wait_for;
  std::string failed_file;
  bool ignore_sigterm = false;
  bool print_env = false;
  bool spawn_child = false;
  int stop_politely = -1;
  bool heartbeat = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "fake worker: " << arg << " needs a value\n";
        std::exit(64);
      }
      return argv[++i];
    };
    if (arg == "--epochs")
      epochs = arg_int(next());
    else if (arg == "--steps")
      steps = arg_int(next());
    else if (arg == "--sleep-ms")
      sleep_ms = arg_int(next());
    else if (arg == "--spam")
      spam = arg_int(next());
    else if (arg == "--long-line")
      long_line = arg_int(next());
    else if (arg == "--fail")
      fail = next();
    else if (arg == "--fail-until-restart")
      fail_until_restart = arg_int(next());
    else if (arg == "--kill-self")
      kill_self = next();
    else if (arg == "--hang")
      hang = next();
    else if (arg == "--hang-ms")
      hang_ms = arg_int(next());
    else if (arg == "--ready-file")
      ready_file = next();
    else if (arg == "--wait-for")
      wait_for = next();
    else if (arg == "--failed-file")
      failed_file = next();
    else if (arg == "--ignore-sigterm")
      ignore_sigterm = true;
    else if (arg == "--print-env")
      print_env = true;
    else if (arg == "--spawn-child")
      spawn_child = true;
    else if (arg == "--heartbeat")
      heartbeat = true;
    else if (arg == "--stop-politely")
      stop_politely = arg_int(next());
    else {
      std::cerr << "fake worker: unknown argument " << arg << "\n";
      return 64;
    }
  }
  if (ignore_sigterm) ignore_polite_stop();
  std::unique_ptr<partrain::StopRequest> stop_request;
  if (stop_politely >= 0) stop_request = std::make_unique<partrain::StopRequest>();
  std::unique_ptr<partrain::Heartbeat> beat;
  if (heartbeat)
    beat = std::make_unique<partrain::Heartbeat>(std::stod(env_or("PARTRAIN_HEARTBEAT_S", "1")));

  const int rank = std::stoi(env_or("RANK", "-1"));
  const int restart = std::stoi(env_or("PARTRAIN_RESTART", "-1"));
  std::cout << "pid " << boost::this_process::get_id() << std::endl;
  std::cout << "restart " << restart << std::endl;

  if (spawn_child) {
    namespace bp = boost::process;
    bp::child child(bp::exe = std::string(argv[0]),
                    bp::args = std::vector<std::string>{"--epochs", "0", "--hang", "all"},
                    bp::std_out > bp::null, bp::std_err > bp::null, bp::std_in < bp::null);
    std::cout << "child pid " << child.id() << std::endl;
    child.detach();  // its fate is the launcher's business, not this process's exit
  }

  if (print_env) {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "GROUP_RANK", "NODE_RANK", "PARTRAIN_RUN_TOKEN", "PARTRAIN_RENDEZVOUS",
          "PARTRAIN_RESTART", "OMP_NUM_THREADS", "PARTRAIN_TEST_EXTRA", "PARTRAIN_T16"}) {
      std::cout << "env " << name << "=" << env_or(name, "<unset>") << std::endl;
    }
#if defined(__linux__)
    // The CPUs it may run on (what the launcher bound it to, if anything).
    std::cout << "cpus " << partrain::cpu_list(partrain::affinity_of(0)) << std::endl;
#endif
    // The launcher's fresh file store must exist while the workers run.
    const std::string url = env_or("PARTRAIN_RENDEZVOUS", "");
    if (url.rfind("file://", 0) == 0) {
      const bool exists = std::filesystem::is_directory(file_url_path(url));
      std::cout << "rendezvous dir " << (exists ? "exists" : "missing") << std::endl;
    }
  }

  for (int i = 0; i < spam; ++i) {
    std::cout << "spam " << i << " of rank " << rank << " " << std::string(300, 'x') << "\n";
  }
  std::cout.flush();

  const bool fail_now = !fail.empty() && field(fail, 0) == rank &&
                        (fail_until_restart < 0 || restart < fail_until_restart);
  for (int e = 1; e <= epochs; ++e) {
    std::cout << partrain::format_epoch_line(e, epochs) << " loss 1.0" << std::endl;
    error_line("warning from rank " + std::to_string(rank) + " in epoch " + std::to_string(e));
    if (fail_now && field(fail, 2) == e) {
      wait_for_file(wait_for);
      error_line("rank " + std::to_string(rank) + " fails on purpose");
      touch(failed_file);
      return field(fail, 1);
    }
    if (!kill_self.empty() && field(kill_self, 0) == rank && field(kill_self, 1) == e) {
      wait_for_file(wait_for);
      touch(failed_file);
      die_like_a_crash();
    }
    for (int s = 1; s <= steps; ++s) {
      std::cout << "step " << s << " of epoch " << e << std::endl;
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
  }

  if (hang == "all" || (!hang.empty() && std::stoi(hang) == rank)) {
    std::cout << "hanging" << std::endl;
    if (!ready_file.empty()) std::ofstream(ready_file) << "ready\n";
    // At most 30 s in all; --hang-ms ends it sooner, counted from --failed-file if given.
    const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto end = bound;
    bool counting = hang_ms >= 0 && failed_file.empty();
    if (counting) end = std::chrono::steady_clock::now() + std::chrono::milliseconds(hang_ms);
    while (std::chrono::steady_clock::now() < end) {
      if (hang_ms >= 0 && !counting && std::filesystem::exists(failed_file)) {
        counting = true;
        end =
            std::min(bound, std::chrono::steady_clock::now() + std::chrono::milliseconds(hang_ms));
      }
      if (stop_request && partrain::StopRequest::requested()) {
        error_line(partrain::format_stopped_line(
            stop_politely, partrain::StopRequest::signal_name(partrain::StopRequest::signal())));
        return partrain::kExitStopped;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(hang_ms >= 0 ? 5 : 50));
    }
    if (!counting) return 99;
    std::cout << "stopped hanging by itself" << std::endl;
    return 1;
  }
  std::cout << "done" << std::endl;
  if (long_line > 0) std::cout << std::string(long_line, 'y') << std::flush;
  return 0;
}
