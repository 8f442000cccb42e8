// The launcher; launcher.h holds the contract.
//
// One start of the group (GroupRun):
//   spawn every local rank with Boost.Process; each worker's stdout and stderr are pipes,
//     all read by one Asio thread that cuts them into whole lines and queues each line,
//     prefixed, for a writer thread of its own (so two workers never share a line, and an
//     output that takes nothing for a while holds no worker: Note [Output that takes nothing])
//   poll the workers every kPollInterval until the first one fails, all succeed, or the
//     launcher itself is told to stop; with a heartbeat, a worker silent for longer than
//     the silence bound is killed and counts as failed (frozen: SIGSTOP, a stalled host)
//   told to stop (or a worker stopped with kExitStopped): the workers get stop_grace to save
//     the step they agree on and exit by themselves
//   with several nodes, give the rest up to kSettleBound to end by themselves (wait_for_rest)
//   stop the rest: a polite stop to each (SIGTERM; CTRL_BREAK_EVENT on Windows), the forced
//     one (SIGKILL; TerminateJobObject) to whoever is left after `grace`, reap them
//   drain what the workers wrote before they died (bounded), then name what happened
// launch() runs that up to 1 + max_restarts times.
//
// Watching has no overall deadline on purpose — a training run may last days. What bounds
// it is that the workers' own waits all time out (a dead peer makes the others fail), and
// that every wait here is a short poll that also checks the launcher's stop signals.
#include "cli/launcher.h"

// clang-format off
// Standard headers first: Boost 1.74's Asio uses std::exchange (C++20) and Process uses
// std::unique_ptr without including their headers.
#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <boost/asio/buffer.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/process.hpp>
// clang-format on

#include "cli/platform_process.h"
#include "common/cpu_list.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/stop_request.h"
#include "common/temp_dir.h"
#include "common/process_state.h"
#include "common/host_name.h"
#include "common/worker_lines.h"

namespace partrain::cli {
namespace {

namespace asio = boost::asio;
namespace bp = boost::process;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{50};
constexpr milliseconds kStopPollInterval{20};
constexpr milliseconds kDrainBound{2000};  // for output still in flight after the last exit
constexpr milliseconds kReapBound{5000};   // for a worker to vanish after the forced stop
// With several nodes: how long the rest of a node's ranks may take to end by themselves after
// one fails, before they are stopped (GroupRun::wait_for_rest).
constexpr milliseconds kSettleBound{1000};
constexpr std::size_t kMaxLineBytes = 64 * 1024;  // longer "lines" are cut into pieces
constexpr int kMaxWorldSize = 1 << 20;

// Note [Output that takes nothing]
// The launcher's own stdout and stderr may stop taking bytes for a while: a terminal paused
// with Ctrl-S, a Windows console in which the user selects text (QuickEdit), a pager nobody
// scrolls. Written from the thread that reads the workers' pipes, one blocked write held that
// thread: the pipes filled, every worker blocked on its next line (its heartbeat too), the ranks
// still computing timed out on the ones blocked, and the launcher, hearing nothing, killed them
// all as frozen once the output moved again. So the lines go to a queue, and a thread of their
// own writes them: the pipes are read, and the workers heard, whatever the output does. The
// queue holds at most kSinkQueueBytes; a line past that is dropped and counted, and the count
// is said once the output takes bytes again. At the end the writer gets kSinkDrainBound to
// write what is left; an output still blocked then is left behind.
constexpr std::size_t kSinkQueueBytes = std::size_t{64} << 20;
constexpr milliseconds kSinkDrainBound{60000};

// Whole lines from every worker, and the launcher's own, onto out and err.
class LineSink {
 public:
  LineSink(std::ostream& out, std::ostream& err)
      : state_(std::make_shared<State>(out, err)), writer_([state = state_] { state->write(); }) {}

  // Everything queued is written first (bounded, Note [Output that takes nothing]).
  ~LineSink() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->closing = true;
    state_->wake.notify_all();
    const bool ended =
        state_->ended.wait_for(lock, kSinkDrainBound, [this] { return state_->finished; });
    lock.unlock();
    if (ended) {
      writer_.join();
    } else {
      writer_.detach();  // blocked in a write; the state lives on with it
    }
  }
  LineSink(const LineSink&) = delete;
  LineSink& operator=(const LineSink&) = delete;

  void worker_line(int rank, bool to_err, std::string_view line) {
    std::string text = "[rank " + std::to_string(rank) + "] ";
    text.append(line);
    text += '\n';
    state_->push(to_err, std::move(text));
  }

  void launcher_line(const std::string& text) { state_->push(true, "partrain: " + text + "\n"); }

 private:
  struct State {
    State(std::ostream& o, std::ostream& e) : out(o), err(e) {}
    std::ostream& out;
    std::ostream& err;
    std::mutex mutex;
    std::condition_variable wake;                    // a line queued, or closing
    std::condition_variable ended;                   // the writer is done
    std::deque<std::pair<bool, std::string>> queue;  // (to stderr, text)
    std::size_t bytes = 0;
    std::uint64_t dropped = 0;
    bool closing = false;
    bool finished = false;

    void push(bool to_err, std::string text) {
      std::lock_guard<std::mutex> lock(mutex);
      if (bytes + text.size() > kSinkQueueBytes) {
        ++dropped;
        return;
      }
      bytes += text.size();
      queue.emplace_back(to_err, std::move(text));
      wake.notify_one();
    }

    // Takes what is queued, all at once, and writes it outside the lock; ends once closing with
    // nothing left.
    void write() {
      for (;;) {
        std::deque<std::pair<bool, std::string>> batch;
        std::uint64_t lost = 0;
        {
          std::unique_lock<std::mutex> lock(mutex);
          wake.wait(lock, [this] { return !queue.empty() || closing || dropped > 0; });
          if (queue.empty() && dropped == 0) {
            finished = true;
            ended.notify_all();
            return;
          }
          batch.swap(queue);
          bytes = 0;
          lost = std::exchange(dropped, 0);
        }
        for (const auto& [to_err, text] : batch) (to_err ? err : out) << text;
        if (lost > 0) {
          err << "partrain: " << lost << " line" << (lost == 1 ? "" : "s")
              << " of output dropped: this process's own output took nothing while more than "
              << (kSinkQueueBytes >> 20) << " MiB waited\n";
        }
        out.flush();
        err.flush();
      }
    }
  };

  std::shared_ptr<State> state_;
  std::thread writer_;  // last: starts once the state is there
};

// One of a worker's two output pipes. Touched only on the io thread once reading starts.
struct OutputPipe {
  OutputPipe(asio::io_context& io, bool to_err) : pipe(io), to_err(to_err) {}
  bp::async_pipe pipe;
  bool to_err;
  std::array<char, 8192> chunk{};
  std::string pending;  // bytes after the last newline seen
  std::atomic<bool> done{false};
};

struct Worker {
  int rank = 0;
  std::unique_ptr<OutputPipe> out;
  std::unique_ptr<OutputPipe> err;
  platform::WorkerGroup group;  // before child: a Windows worker is born into its job
  bp::child child;
  int pid = 0;
  std::atomic<int> epoch{0};       // last "epoch E/N" line seen; written on the io thread
  std::atomic<int> lost_rank{-1};  // from its "partrain: lost rank R" line, if any
  std::atomic<std::int64_t> stopped_step{-1};    // from its "partrain: stopped at step N" line
  std::atomic<bool> stopped_in_start_up{false};  // its "partrain: stopped during start-up"
  std::string flight;  // from its "partrain: at failure, WHERE" line; read once output ended
  std::optional<RankStopped> lost_why;  // that line's "; rank R (HOST) stopped: WHY"; the same
  // When it last wrote a line (a heartbeat included), in Clock's nanoseconds.
  std::atomic<std::int64_t> last_heard_ns{0};
  bool running = false;  // spawned and not reaped yet
  platform::ExitStatus status;
  bool stopped = false;         // still running when the group was stopped
  bool killed = false;          // needed the forced stop after the grace period
  bool killed_at_once = false;  // got the forced stop at once: the polite one cannot reach it
  bool frozen = false;          // killed for its silence
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct GroupOutcome {
  // kStopped: a worker exited with kExitStopped though this launcher got no signal (another
  // node's did, and the ranks agreed to stop).
  enum class Kind { kSucceeded, kFailed, kInterrupted, kStopped };
  Kind kind = Kind::kSucceeded;
  int failed_rank = -1;
  platform::ExitStatus failed_status;
  int failed_epoch = 0;
  int failed_lost_rank = -1;
  int signal = 0;              // kInterrupted: the launcher's signal
  double failed_silent_s = 0;  // the failed worker was killed after this long silent
  // What its process showed before that kill, as the launcher said then ("is stopped (SIGSTOP
  // or SIGTSTP)"); empty where the system does not say.
  std::string failed_frozen_state;
  std::int64_t stopped_step = -1;    // the step the workers said they stopped at, if any
  bool stopped_in_start_up = false;  // a worker said it stopped before its first step
  bool all_exited_stopped = false;   // every worker ended with kExitStopped
  bool all_succeeded = false;        // every worker ended with 0
  // Why the lost rank stopped, where it said (its "; rank R (HOST) stopped: WHY").
  std::optional<RankStopped> failed_lost_why;
  std::vector<int> stopped;
  std::vector<int> killed;
  std::vector<int> killed_at_once;
  // Where each worker that dumped a flight record stood among its collectives, by rank.
  std::vector<std::pair<int, std::string>> flights;
};

// One start of the group; see the top of the file.
class GroupRun {
 public:
  explicit GroupRun(LineSink& sink)
      : sink_(sink), guard_(asio::make_work_guard(io_)), io_thread_([this] { io_.run(); }) {}

  ~GroupRun() {
    // Finds workers still running only when something threw: then stop them hard.
    try {
      stop_all(milliseconds(0), nullptr);
    } catch (...) {
      // bp::child's destructor kills what is left.
    }
    finish_output();
  }

  GroupRun(const GroupRun&) = delete;
  GroupRun& operator=(const GroupRun&) = delete;

  // Returns the CPUs the worker may run on as the system reports them once it started
  // ("" where it does not say).
  std::string spawn(int rank, const std::string& executable, const std::vector<std::string>& args,
                    bp::environment env, const std::vector<int>& cpus) {
    auto worker = std::make_unique<Worker>();
    Worker& w = *worker;
    w.rank = rank;
    w.out = std::make_unique<OutputPipe>(io_, false);
    w.err = std::make_unique<OutputPipe>(io_, true);
    for (OutputPipe* p : {w.out.get(), w.err.get()}) {
      platform::set_close_on_exec(p->pipe.native_source());
      platform::set_close_on_exec(p->pipe.native_sink());
    }
    const platform::WorkerChildSetup setup = w.group.child_setup(cpus);
    try {
      w.child = bp::child(bp::exe = executable, bp::args = args, env, bp::std_out > w.out->pipe,
                          bp::std_err > w.err->pipe, bp::std_in < bp::null, setup);
    } catch (const std::exception& e) {
      throw Error(detail::concat("cannot start rank ", rank, " (", executable, "): ", e.what()));
    }
    w.pid = w.child.id();
    w.last_heard_ns = now_ns();
    w.group.started(w.pid);
    w.running = true;
    workers_.push_back(std::move(worker));
    asio::post(io_, [this, &w] {
      read_more(w, *w.out);
      read_more(w, *w.err);
    });
    return cpus.empty() ? std::string() : w.group.worker_cpus();
  }

  // Waits for the first failure, full success or a stop signal (one newer than
  // `signals_seen`), stops whoever is left and drains their output.
  // After a failure the rest get up to `settle` to end by themselves before they are stopped.
  // A worker killed by a signal, which could not say why it stopped, is told of through
  // `tell_stopped` (rank, why), where that is set.
  GroupOutcome watch(const LaunchPlan& plan, milliseconds settle,
                     const platform::StopSignals& signals, int signals_seen,
                     const std::function<void(int, const std::string&)>& tell_stopped) {
    GroupOutcome outcome;
    // Set once a worker exited with kExitStopped: the rest follow by themselves, until then.
    std::optional<Clock::time_point> stopping_until;
    for (;;) {
      if (signals.count() != signals_seen) {
        outcome.kind = GroupOutcome::Kind::kInterrupted;
        outcome.signal = signals.last_signal();
        break;
      }
      Worker* failed = nullptr;
      bool any_running = false;
      for (auto& w : workers_) {
        if (!w->running) continue;
        if (!reap(*w)) {
          any_running = true;
          if (is_silent_too_long(*w, plan)) failed = freeze_kill(*w, plan, failed);
        } else if (w->status.code == kExitStopped && !w->status.killed()) {
          if (!stopping_until) stopping_until = Clock::now() + plan.stop_grace;
        } else if (!w->status.success() && prefer_as_cause(*w, failed)) {
          failed = w.get();
        }
      }
      if (failed != nullptr) {
        outcome.kind = GroupOutcome::Kind::kFailed;
        outcome.failed_rank = failed->rank;
        outcome.failed_status = failed->status;
        if (failed->frozen) {
          outcome.failed_silent_s = frozen_silent_s_;
          outcome.failed_frozen_state = frozen_state_;
        }
        // Before the others here are stopped: ranks on other nodes that lost it trace the
        // failure to it for a grace period, then look for its reason.
        if (tell_stopped && failed->status.killed() && !failed->frozen) {
          tell_stopped(failed->rank, "its process " + platform::describe_exit(failed->status));
        }
        break;
      }
      if (stopping_until && (!any_running || Clock::now() > *stopping_until)) {
        outcome.kind = GroupOutcome::Kind::kStopped;
        break;
      }
      if (!any_running) break;
      std::this_thread::sleep_for(kPollInterval);
    }
    if (outcome.kind == GroupOutcome::Kind::kFailed) wait_for_rest(settle, signals, signals_seen);
    const bool stopping = outcome.kind == GroupOutcome::Kind::kInterrupted ||
                          outcome.kind == GroupOutcome::Kind::kStopped;
    stop_all(stopping ? plan.stop_grace : plan.grace, &signals);
    finish_output();
    outcome.all_exited_stopped = !workers_.empty();
    outcome.all_succeeded = !workers_.empty();
    for (auto& w : workers_) {
      if (w->stopped) outcome.stopped.push_back(w->rank);
      if (w->killed) outcome.killed.push_back(w->rank);
      if (w->killed_at_once) outcome.killed_at_once.push_back(w->rank);
      if (w->rank == outcome.failed_rank) {
        outcome.failed_epoch = w->epoch.load();
        outcome.failed_lost_rank = w->lost_rank.load();
        outcome.failed_lost_why = w->lost_why;
      }
      outcome.stopped_step = std::max(outcome.stopped_step, w->stopped_step.load());
      outcome.stopped_in_start_up = outcome.stopped_in_start_up || w->stopped_in_start_up.load();
      if (!w->flight.empty()) outcome.flights.emplace_back(w->rank, w->flight);
      const bool exited_stopped = !w->status.killed() && w->status.code == kExitStopped;
      outcome.all_exited_stopped = outcome.all_exited_stopped && exited_stopped;
      outcome.all_succeeded = outcome.all_succeeded && w->status.success();
    }
    return outcome;
  }

  double silent_seconds(const Worker& w) const {
    return static_cast<double>(now_ns() - w.last_heard_ns.load()) * 1e-9;
  }

 private:
  // Of several workers found dead in one poll, name one killed (a signal, a crash) over one
  // that exited with a code: the usual story is "rank 1 was killed, so rank 0 lost its peer and
  // exited 1", and the cause is rank 1.
  static bool prefer_as_cause(const Worker& w, const Worker* current) {
    return current == nullptr || (w.status.killed() && !current->status.killed());
  }

  // With a heartbeat: the worker wrote nothing, not even its heartbeat, for longer than the
  // bound, so it no longer runs (stopped, or its host stalled) though it has not exited.
  bool is_silent_too_long(const Worker& w, const LaunchPlan& plan) const {
    return plan.heartbeat_interval.count() > 0 &&
           silent_seconds(w) * 1000.0 > static_cast<double>(plan.silence_bound.count());
  }

  // Kills a frozen worker (SIGKILL reaches a stopped process too) and reaps it, bounded;
  // returns the worker to name as the cause.
  Worker* freeze_kill(Worker& w, const LaunchPlan& plan, Worker* current) {
    const double silent = silent_seconds(w);
    // What its process shows, where the system says (stopped, blocked in the kernel, busy):
    // why it wrote nothing. Not yet reaped, the pid is still this worker's.
    const std::optional<ProcessState> state = watch_process(w.pid, process_start_ticks(w.pid));
    const std::string shown = state ? describe_process_state(*state, w.pid, false) : "";
    sink_.launcher_line(detail::concat(
        "rank ", w.rank, " (pid ", w.pid, ") wrote nothing for ", static_cast<int>(silent),
        " s, not even its heartbeat (every ", plan.heartbeat_interval.count() / 1000.0,
        " s): it is frozen", shown.empty() ? std::string() : ": its process " + shown, "; ",
        platform::kForceStopName));
    w.frozen = true;
    frozen_silent_s_ = silent;
    frozen_state_ = shown;
    w.group.force_stop();
    const auto reap_end = Clock::now() + kReapBound;
    while (!reap(w) && Clock::now() < reap_end) std::this_thread::sleep_for(kStopPollInterval);
    if (w.running) {  // did not go: stop waiting for it, as stop_all does
      w.child.detach();
      w.running = false;
      w.status.signal = 9;
    }
    return current == nullptr || !current->frozen ? &w : current;
  }

  // True when the worker has ended (and is now reaped, its status recorded).
  bool reap(Worker& w) {
    if (!w.running) return true;
    if (w.child.running()) return false;
    w.running = false;
    w.status = platform::decode_exit_status(w.child.native_exit_code());
    return true;
  }

  bool reap_all() {
    bool all = true;
    for (auto& w : workers_) all = reap(*w) && all;
    return all;
  }

  // Lets the other workers end by themselves for up to `window` (a stop signal cuts it short).
  // With several nodes this is how a rank dead on this node gets named on the others: the
  // survivors here see the failure in their collectives and publish in the store whom they
  // lost, and the other nodes' ranks follow that chain of blame (failure_trace.h). A survivor
  // stopped before it published would be named in place of the rank that died.
  void wait_for_rest(milliseconds window, const platform::StopSignals& signals, int signals_seen) {
    const auto end = Clock::now() + window;
    while (!reap_all() && Clock::now() < end && signals.count() == signals_seen) {
      std::this_thread::sleep_for(kStopPollInterval);
    }
  }

  // The polite stop to each running worker, the forced one to those left after `grace` (or
  // at once when the launcher gets another stop signal meanwhile: a second Ctrl-C means
  // "now"), and at once to those the polite stop cannot reach (Windows without a console).
  void stop_all(milliseconds grace, const platform::StopSignals* signals) {
    bool any = false;
    for (auto& w : workers_) {
      if (!w->running) continue;
      w->stopped = true;
      if (!w->group.request_stop()) {
        w->killed_at_once = true;
        w->group.force_stop();
      }
      any = true;
    }
    if (!any) return;
    const int signals_seen = signals != nullptr ? signals->count() : 0;
    const auto grace_end = Clock::now() + grace;
    while (!reap_all() && Clock::now() < grace_end &&
           (signals == nullptr || signals->count() == signals_seen)) {
      std::this_thread::sleep_for(kStopPollInterval);
    }
    for (auto& w : workers_) {
      if (!w->running || w->killed_at_once) continue;
      w->killed = true;
      w->group.force_stop();
    }
    const auto reap_end = Clock::now() + kReapBound;
    while (!reap_all() && Clock::now() < reap_end) std::this_thread::sleep_for(kStopPollInterval);
    for (auto& w : workers_) {
      if (!w->running) continue;
      // Stuck in the kernel (uninterruptible I/O): waiting longer would hang the launcher.
      sink_.launcher_line(detail::concat("rank ", w->rank, " (pid ", w->pid,
                                         ") did not exit after ", platform::kForceStopName,
                                         "; leaving it"));
      w->child.detach();
      w->running = false;
    }
  }

  void read_more(Worker& w, OutputPipe& p) {
    p.pipe.async_read_some(asio::buffer(p.chunk),
                           [this, &w, &p](const boost::system::error_code& ec, std::size_t n) {
                             if (n > 0) take_bytes(w, p, std::string_view(p.chunk.data(), n));
                             if (ec) {  // end of file, or the pipe was closed by finish_output
                               if (!p.pending.empty()) emit(w, p, p.pending);
                               p.pending.clear();
                               p.done = true;
                               return;
                             }
                             read_more(w, p);
                           });
  }

  void take_bytes(Worker& w, OutputPipe& p, std::string_view bytes) {
    p.pending.append(bytes);
    std::size_t start = 0;
    for (std::size_t nl; (nl = p.pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(w, p, std::string_view(p.pending).substr(start, nl - start));
    p.pending.erase(0, start);
    while (p.pending.size() >= kMaxLineBytes) {
      emit(w, p, std::string_view(p.pending).substr(0, kMaxLineBytes));
      p.pending.erase(0, kMaxLineBytes);
    }
  }

  void emit(Worker& w, const OutputPipe& p, std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    w.last_heard_ns = now_ns();
    if (const int epoch = parse_epoch_line(line); epoch > 0) w.epoch = epoch;
    if (p.to_err) {
      if (is_heartbeat_line(line)) return;  // for the launcher alone
      if (const int lost = parse_lost_rank_line(line); lost >= 0) {
        w.lost_rank = lost;
        w.lost_why = parse_rank_stopped(line);
      }
      if (const std::int64_t step = parse_stopped_line(line); step >= 0) w.stopped_step = step;
      if (is_start_up_stop_line(line)) w.stopped_in_start_up = true;
      if (std::string where = parse_flight_line(line); !where.empty()) w.flight = std::move(where);
    }
    sink_.worker_line(w.rank, p.to_err, line);
  }

  // Waits (bounded) until every pipe reached end of file, closes what is left open — a
  // grandchild of a worker may still hold it — and ends the io thread.
  void finish_output() {
    if (!io_thread_.joinable()) return;
    const auto drain_end = Clock::now() + kDrainBound;
    auto all_done = [this] {
      return std::all_of(workers_.begin(), workers_.end(),
                         [](const auto& w) { return w->out->done && w->err->done; });
    };
    while (!all_done() && Clock::now() < drain_end) std::this_thread::sleep_for(kStopPollInterval);
    asio::post(io_, [this] {
      for (auto& w : workers_) {
        boost::system::error_code ignored;
        w->out->pipe.close(ignored);
        w->err->pipe.close(ignored);
      }
    });
    guard_.reset();
    io_thread_.join();
  }

  LineSink& sink_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::vector<std::unique_ptr<Worker>> workers_;
  double frozen_silent_s_ = 0;
  std::string frozen_state_;  // what that worker's process showed (describe_process_state())
  std::thread io_thread_;     // last: starts after everything it reads is constructed
};

// The fresh file:// stores of a single-node run without a rendezvous: one directory per run
// under the system temp directory, one subdirectory per start of the group (a restart must
// not find the keys of the start before), all removed at the end. Owner-only: the store
// holds the addresses the ranks connect to.
class FreshStoreRoot {
 public:
  std::string dir_for_start(int restart) const {
    const auto dir = root_.path() / ("start-" + std::to_string(restart));
    std::error_code ec;
    std::filesystem::create_directory(dir, ec);
    PARTRAIN_CHECK(!ec, Error, "cannot make the rendezvous directory ", dir.string(), ": ",
                   ec.message());
    return dir.generic_string();
  }

 private:
  TempDir root_{"partrain-run"};
};

// Whether every CPU of `cpus` (ascending) is one of `allowed` (in any order).
bool within(const std::vector<int>& cpus, std::vector<int> allowed) {
  std::sort(allowed.begin(), allowed.end());
  return !cpus.empty() && std::includes(allowed.begin(), allowed.end(), cpus.begin(), cpus.end());
}

void check_plan(const LaunchPlan& plan) {
  PARTRAIN_CHECK(!plan.executable.empty(), UsageError, "no worker executable to launch");
  PARTRAIN_CHECK(plan.nodes.is_per_node(), UsageError,
                 "the plan's nodes need one count each (NodeLayout::for_nodes)");
  for (const int n : plan.nodes.counts()) {
    PARTRAIN_CHECK_GE(n, 1, UsageError, "nproc_per_node is too small");
  }
  const int nnodes = plan.nodes.nodes();
  PARTRAIN_CHECK_GE(nnodes, 1, UsageError, "nnodes is too small");
  PARTRAIN_CHECK(plan.node_rank >= 0 && plan.node_rank < nnodes, UsageError, "node_rank ",
                 plan.node_rank, " is outside 0..", nnodes - 1, " (nnodes ", nnodes, ")");
  PARTRAIN_CHECK(plan.nodes.world_size() <= kMaxWorldSize, UsageError, plan.nodes.world_size(),
                 " ranks in all is more than the ", kMaxWorldSize, " supported");
  PARTRAIN_CHECK(plan.master_port >= 0 && plan.master_port <= 65535, UsageError, "master_port ",
                 plan.master_port, " is outside 0..65535");
  PARTRAIN_CHECK(nnodes == 1 || plan.master_port != 0, UsageError,
                 "a master port is required with nnodes > 1: every node must name the same one");
  PARTRAIN_CHECK(!plan.master_addr.empty(), UsageError, "the master address is empty");
  PARTRAIN_CHECK_GE(plan.max_restarts, 0, UsageError, "max_restarts is negative");
  PARTRAIN_CHECK(plan.grace.count() >= 0, UsageError, "the stop grace period is negative");
  PARTRAIN_CHECK(plan.stop_grace.count() >= 0, UsageError, "the stop_grace period is negative");
  PARTRAIN_CHECK(
      plan.heartbeat_interval.count() >= 0 && (plan.heartbeat_interval.count() == 0 ||
                                               plan.silence_bound > 2 * plan.heartbeat_interval),
      UsageError, "the silence bound must exceed two heartbeat intervals");
  PARTRAIN_CHECK(plan.local_cpus.empty() || static_cast<int>(plan.local_cpus.size()) ==
                                                plan.nodes.ranks_on(plan.node_rank),
                 UsageError, "CPUs for ", plan.local_cpus.size(), " ranks, but this node runs ",
                 plan.nodes.ranks_on(plan.node_rank));
  for (const auto& cpus : plan.local_cpus) {
    PARTRAIN_CHECK(!cpus.empty() && std::all_of(cpus.begin(), cpus.end(),
                                                [](int cpu) { return cpu >= 0 && cpu < 65536; }),
                   UsageError, "a rank's CPUs must be one or more ids in 0..65535");
  }
}

std::string env_value(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::string describe_failure(const GroupOutcome& o) {
  std::ostringstream text;
  text << "rank " << o.failed_rank << " " << platform::describe_exit(o.failed_status);
  if (o.failed_epoch > 0) {
    text << " during epoch " << o.failed_epoch;
  } else {
    text << " before its first epoch";
  }
  if (o.failed_silent_s > 0) {
    text << ": it was frozen (nothing written, not even a heartbeat, for "
         << static_cast<int>(o.failed_silent_s) << " s";
    // "is stopped (SIGSTOP or SIGTSTP)" said before the kill: "its process was stopped ...".
    constexpr std::string_view kIs = "is ";
    if (o.failed_frozen_state.starts_with(kIs)) {
      text << "; its process was " << o.failed_frozen_state.substr(kIs.size());
    }
    text << ")";
  } else if (o.failed_lost_rank >= 0 && o.failed_lost_rank != o.failed_rank) {
    text << ": it lost rank " << o.failed_lost_rank;
    if (o.failed_lost_why) {
      text << ", which stopped on " << o.failed_lost_why->host << ": " << o.failed_lost_why->why;
    }
  }
  // From the flight records: "rank 1 in allreduce #135 ..., rank 0 in allreduce #136 ...".
  for (std::size_t i = 0; i < o.flights.size(); ++i) {
    text << (i == 0 ? "; where the ranks stood: " : ", ") << "rank " << o.flights[i].first << " "
         << o.flights[i].second;
  }
  return text.str();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream text;
  for (std::size_t i = 0; i < ranks.size(); ++i) text << (i > 0 ? "," : "") << ranks[i];
  return text.str();
}

std::string describe_stops(const GroupOutcome& o, milliseconds grace) {
  if (o.stopped.empty()) return "";
  std::ostringstream text;
  text << "; stopped rank" << (o.stopped.size() > 1 ? "s " : " ") << join_ranks(o.stopped);
  if (!o.killed.empty()) {
    text << " (" << platform::kForceStopName << " after ";
    if (grace.count() % 1000 == 0) {
      text << grace.count() / 1000 << " s";
    } else {
      text << grace.count() << " ms";
    }
    text << " for rank" << (o.killed.size() > 1 ? "s " : " ") << join_ranks(o.killed) << ")";
  }
  if (!o.killed_at_once.empty()) {
    text << " (" << platform::kForceStopName << " at once for rank"
         << (o.killed_at_once.size() > 1 ? "s " : " ") << join_ranks(o.killed_at_once)
         << ": no CTRL_BREAK_EVENT could reach " << (o.killed_at_once.size() > 1 ? "them" : "it")
         << ")";
  }
  return text.str();
}

// Boost.Process 1.74 looks a name up in a bp::environment (operator[], count, emplace: its
// find()) by comparing "NAME=" with each entry through std::equal, with no length check, so it
// reads past an entry shorter than that: ASan reports a heap-buffer-overflow where the
// environment holds a variable of 16 to 18 characters, such as RUST_BACKTRACE=1, and RANK
// is looked up. So the worker's environment is gathered here and handed to an empty
// bp::environment longest entry first: each lookup then meets only entries at least as long
// as the "NAME=VALUE" it adds.
bp::environment worker_environment(const LaunchPlan& plan, int local_rank, const std::string& token,
                                   const std::string& rendezvous, int master_port, int restart) {
  std::map<std::string, std::string> vars;
  for (const auto& entry : boost::this_process::environment()) {
    // Not Windows' hidden "=C:=C:\dir" entries (a drive's current folder): a child needs none.
    if (!entry.get_name().empty()) vars[entry.get_name()] = entry.to_string();
  }
  const int local_world_size = plan.nodes.ranks_on(plan.node_rank);
  vars["RANK"] = std::to_string(plan.nodes.first_rank(plan.node_rank) + local_rank);
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["WORLD_SIZE"] = std::to_string(plan.nodes.world_size());
  vars["LOCAL_WORLD_SIZE"] = std::to_string(local_world_size);
  vars["MASTER_ADDR"] = plan.master_addr;
  vars["MASTER_PORT"] = std::to_string(master_port);
  vars["GROUP_RANK"] = std::to_string(plan.node_rank);
  vars["NODE_RANK"] = std::to_string(plan.node_rank);
  vars["PARTRAIN_RUN_TOKEN"] = token;
  vars["PARTRAIN_RENDEZVOUS"] = rendezvous;
  vars["PARTRAIN_RESTART"] = std::to_string(restart);
  if (plan.heartbeat_interval.count() > 0) {
    vars["PARTRAIN_HEARTBEAT_S"] = std::to_string(plan.heartbeat_interval.count() / 1000.0);
  }
  if (vars.count("OMP_NUM_THREADS") == 0) {
    // N ranks each starting an OpenMP pool of every core would oversubscribe N times; a rank
    // bound to fewer CPUs than its share gets no more threads than it has CPUs.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    unsigned threads = std::max(1u, cores / static_cast<unsigned>(local_world_size));
    if (!plan.local_cpus.empty()) {
      threads = std::min(threads, static_cast<unsigned>(plan.local_cpus[local_rank].size()));
    }
    vars["OMP_NUM_THREADS"] = std::to_string(threads);
  }
  for (const auto& [name, value] : plan.extra_env) vars[name] = value;
  std::vector<std::pair<std::string, std::string>> longest_first(vars.begin(), vars.end());
  std::stable_sort(longest_first.begin(), longest_first.end(), [](const auto& a, const auto& b) {
    return a.first.size() + a.second.size() > b.first.size() + b.second.size();
  });
  bp::environment env;
  for (const auto& [name, value] : longest_first) env.emplace(name, value);
  return env;
}

}  // namespace

int pick_free_loopback_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  const asio::ip::tcp::endpoint any_port(asio::ip::make_address("127.0.0.1"), 0);
  boost::system::error_code ec;
  acceptor.open(any_port.protocol(), ec);
  if (!ec) acceptor.bind(any_port, ec);
  PARTRAIN_CHECK(!ec, Error, "cannot find a free port on 127.0.0.1: ", ec.message());
  return acceptor.local_endpoint().port();
}

std::string choose_run_token(const LaunchPlan& plan, const std::string& env_token) {
  if (!env_token.empty()) return env_token;
  if (plan.nodes.nodes() == 1) {
    std::random_device random;
    auto draw64 = [&random] {
      return (static_cast<std::uint64_t>(random()) << 32) ^ static_cast<std::uint64_t>(random());
    };
    const std::uint64_t high = draw64();
    return hex_128(high, draw64());
  }
  // Fields separated by a byte no argument contains, so ("ab","c") and ("a","bc") differ.
  std::string shared = "partrain-run-token";
  auto add = [&shared](std::string_view field) {
    shared += '\0';
    shared += field;
  };
  add(plan.master_addr);
  add(std::to_string(plan.master_port));
  add(std::to_string(plan.nodes.nodes()));
  if (plan.nodes.is_even()) {
    add(std::to_string(plan.nodes.ranks_on(0)));
  } else {  // the layout every node shares, not this node's own count
    std::string sizes = "node sizes";
    for (const int n : plan.nodes.counts()) sizes += " " + std::to_string(n);
    add(sizes);
  }
  if (!plan.run_identity.empty()) {
    add(plan.run_identity);
  } else {
    add(std::filesystem::path(plan.executable).filename().string());
    for (const auto& arg : plan.worker_args) add(arg);
  }
  return fnv1a_128_hex(shared);
}

std::string rendezvous_for(const LaunchPlan& plan, const std::string& fresh_dir) {
  if (!plan.rendezvous.empty()) return plan.rendezvous;
  if (plan.nodes.nodes() > 1) {
    return "tcp://" + plan.master_addr + ":" + std::to_string(plan.master_port);
  }
  // file:///tmp/x, and file:///C:/x for a Windows path.
  return fresh_dir.starts_with('/') ? "file://" + fresh_dir : "file:///" + fresh_dir;
}

int launch(const LaunchPlan& plan) {
  check_plan(plan);
  LineSink sink(plan.out != nullptr ? *plan.out : std::cout,
                plan.err != nullptr ? *plan.err : std::cerr);
  const std::string token = choose_run_token(plan, env_value("PARTRAIN_RUN_TOKEN"));
  std::unique_ptr<FreshStoreRoot> fresh_store;
  const bool one_node = plan.nodes.nodes() == 1;
  if (plan.rendezvous.empty() && one_node) fresh_store = std::make_unique<FreshStoreRoot>();

  platform::StopSignals signals;
  for (int restart = 0;; ++restart) {
    // A port picked per start: the previous start's sockets may still hold the old one.
    const int port = plan.master_port != 0 ? plan.master_port : pick_free_loopback_port();
    LaunchPlan resolved = plan;
    resolved.master_port = port;
    const std::string rendezvous =
        rendezvous_for(resolved, fresh_store ? fresh_store->dir_for_start(restart) : "");

    GroupOutcome outcome;
    {
      const int signals_seen = 0;  // any stop signal since launch() began ends the run
      GroupRun group(sink);
      const int first_rank = plan.nodes.first_rank(plan.node_rank);
      for (int local = 0; local < plan.nodes.ranks_on(plan.node_rank); ++local) {
        if (signals.count() != signals_seen) break;
        const std::vector<int> no_cpus;
        const std::vector<int>& cpus = plan.local_cpus.empty() ? no_cpus : plan.local_cpus[local];
        const std::string runs_on =
            group.spawn(first_rank + local, plan.executable, plan.worker_args,
                        worker_environment(plan, local, token, rendezvous, port, restart), cpus);
        // Silent when the binding took, as on most starts; a rank it missed runs on, unbound.
        // The rank may already have narrowed itself further (an OpenMP runtime told to bind
        // by OMP_PROC_BIND): only CPUs outside the plan's say that it missed.
        if (!runs_on.empty() && !within(cpus_of(runs_on), cpus)) {
          sink.launcher_line(detail::concat("rank ", first_rank + local,
                                            " could not be bound to CPUs ", cpu_list(cpus),
                                            "; it runs on CPUs ", runs_on));
        }
      }
      // Rank 0 serves a tcp rendezvous: with it gone, there is no store to tell.
      std::function<void(int, const std::string&)> tell;
      if (plan.tell_rank_stopped && !one_node && rendezvous.starts_with("tcp://")) {
        tell = [&](int rank, const std::string& why) {
          if (rank != 0) {
            plan.tell_rank_stopped(rendezvous, token, rank,
                                   format_rank_stopped(rank, this_host_name(), why));
          }
        };
      }
      outcome =
          group.watch(plan, one_node ? milliseconds(0) : kSettleBound, signals, signals_seen, tell);
    }

    using Kind = GroupOutcome::Kind;
    if (outcome.kind == Kind::kSucceeded) return 0;
    const bool stop_signal = outcome.kind == Kind::kInterrupted;
    if ((stop_signal || outcome.kind == Kind::kStopped) && outcome.all_exited_stopped) {
      // No signal here: it reached a rank, this node's (sent to it alone) or another's.
      const std::string by = stop_signal ? platform::stop_cause_name(outcome.signal)
                             : one_node  ? "a stop signal to one of the ranks"
                                         : "a stop request from another node";
      // Ranks stopped in their start-up saved nothing: they had no step to agree on.
      const std::string at = outcome.stopped_step >= 0
                                 ? "at step " + std::to_string(outcome.stopped_step) + " "
                             : outcome.stopped_in_start_up ? "during start-up "
                                                           : "";
      sink.launcher_line("stopped " + at + "by " + by + "; run the same command to continue");
      return kExitStopped;
    }
    if (stop_signal && outcome.all_succeeded) {
      sink.launcher_line("got " + platform::stop_cause_name(outcome.signal) +
                         " after the last step: the run completed");
      return 0;
    }
    if (outcome.kind == Kind::kInterrupted) {
      sink.launcher_line("interrupted by " + platform::stop_cause_name(outcome.signal) +
                         describe_stops(outcome, plan.stop_grace));
      return 128 + outcome.signal;
    }
    if (outcome.kind == Kind::kStopped) {
      sink.launcher_line("a worker stopped at a stop request but not all of them did" +
                         describe_stops(outcome, plan.stop_grace));
      return 1;
    }
    const bool bad_input = !outcome.failed_status.killed() && outcome.failed_status.code == 2;
    if (restart < plan.max_restarts && !bad_input) {
      sink.launcher_line(detail::concat("restarting the group (restart ", restart + 1, " of ",
                                        plan.max_restarts, ") after ", describe_failure(outcome)));
      continue;
    }
    std::string line = describe_failure(outcome) + describe_stops(outcome, plan.grace);
    if (restart > 0) {
      line += detail::concat("; gave up after ", restart, " restart", restart > 1 ? "s" : "");
    }
    sink.launcher_line(line);
    return bad_input ? 2 : 1;
  }
}

// Boost.DLL knows each system's way (/proc/self/exe, _NSGetExecutablePath, GetModuleFileName),
// so one definition serves every platform.
std::string platform::executable_path() {
  std::error_code ec;
  const auto path = boost::dll::program_location(ec);
  PARTRAIN_CHECK(!ec, Error, "cannot find this executable's path: ", ec.message());
  return path.string();
}

}  // namespace partrain::cli
