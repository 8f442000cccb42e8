// StallMeter: which part of a span the recorded stalls cover, and a real stop of this process
// (SIGSTOP from a child, then SIGCONT) seen as a stall of about its length; PhaseTimes keeps the
// spans of forward and backward for it.
#include "trainer/observe/stall_meter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "trainer/observe/phase_times.h"

#ifndef _WIN32
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif

namespace partrain {
namespace {

using std::chrono::milliseconds;

TEST(StallMeter, CountsTheOverlapOfStallsWithTheSpans) {
  StallMeter meter;
  const Clock::time_point t0 = Clock::now() - std::chrono::seconds(10);
  auto at = [&](int ms) { return t0 + milliseconds(ms); };
  meter.record({at(10), at(30)});
  meter.record({at(50), at(60)});
  EXPECT_EQ(meter.stalled_within({{at(0), at(100)}}), milliseconds(30));
  EXPECT_EQ(meter.stalled_within({{at(20), at(55)}}), milliseconds(15));
  EXPECT_EQ(meter.stalled_within({{at(0), at(5)}, {at(25), at(52)}}), milliseconds(7));
  EXPECT_EQ(meter.stalled_within({{at(30), at(50)}}), milliseconds(0));
  EXPECT_EQ(meter.stalled_within({}), milliseconds(0));
  // Whole, oldest first: what a span overlaps, not cut to it.
  const std::vector<TimeSpan> found = meter.stalls_overlapping({at(20), at(55)});
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].start, at(10));
  EXPECT_EQ(found[0].end, at(30));
  EXPECT_EQ(found[1].start, at(50));
  EXPECT_TRUE(meter.stalls_overlapping({at(30), at(50)}).empty());
}

// Stalls no longer than the step's own work are slices of it and count (the part inside the
// span); a longer one is an absence for whole steps and does not, even where it overlaps.
TEST(StallMeter, OnlyStallsShorterThanTheWorkCountAsWork) {
  const Clock::time_point t0 = Clock::now();
  auto at = [&](int ms) { return t0 + milliseconds(ms); };
  const TimeSpan step{at(0), at(100)};
  const std::vector<TimeSpan> stalls = {{at(-5), at(5)},     // 10 ms, 5 of them in the step
                                        {at(20), at(30)},    // 10 ms
                                        {at(40), at(100)},   // 60 ms: longer than the 30 ms of work
                                        {at(95), at(110)}};  // 15 ms, 5 of them in the step
  EXPECT_EQ(stalls_within_work(stalls, step, milliseconds(30)), milliseconds(20));
  // With 60 ms of work, the long stall is a slice too.
  EXPECT_EQ(stalls_within_work(stalls, step, milliseconds(60)), milliseconds(80));
  EXPECT_EQ(stalls_within_work({}, step, milliseconds(30)), milliseconds(0));
}

TEST(StallMeter, KeepsTheNewestStallsOnly) {
  StallMeterOptions options;
  options.keep = 2;
  StallMeter meter(options);
  const Clock::time_point t0 = Clock::now() - std::chrono::seconds(10);
  for (int k = 0; k < 3; ++k)
    meter.record({t0 + milliseconds(10 * k), t0 + milliseconds(10 * k + 5)});
  EXPECT_EQ(meter.stalled_within({{t0, t0 + milliseconds(100)}}), milliseconds(10));
}

#ifndef _WIN32
// A child stops this process for about 150 ms and writes how long it kept it stopped; the meter
// records that stop, its start known to within half a tick.
TEST(StallMeter, SeesTheProcessStoppedFromOutside) {
  StallMeter meter;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const Clock::time_point from = Clock::now();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // async-signal-safe calls only
    const timespec before_stop{0, 30'000'000}, stopped{0, 150'000'000};
    nanosleep(&before_stop, nullptr);
    timespec a{}, b{};
    clock_gettime(CLOCK_MONOTONIC, &a);
    kill(getppid(), SIGSTOP);
    nanosleep(&stopped, nullptr);
    clock_gettime(CLOCK_MONOTONIC, &b);
    kill(getppid(), SIGCONT);
    const long long ns = (b.tv_sec - a.tv_sec) * 1'000'000'000LL + (b.tv_nsec - a.tv_nsec);
    (void)!write(pipe_fds[1], &ns, sizeof(ns));
    _exit(0);
  }
  close(pipe_fds[1]);
  long long stopped_ns = 0;
  ASSERT_EQ(read(pipe_fds[0], &stopped_ns, sizeof(stopped_ns)),
            static_cast<ssize_t>(sizeof(stopped_ns)));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // The meter records the stall when its thread runs again, within a few ticks.
  std::this_thread::sleep_for(milliseconds(20));
  const Clock::time_point to = Clock::now();
  const double stalled_ms =
      std::chrono::duration<double, std::milli>(meter.stalled_within({{from, to}})).count();
  const double stop_ms = static_cast<double>(stopped_ns) / 1e6;
  const double half_tick_ms = StallMeterOptions{}.tick.count() / 2000.0;
  EXPECT_GE(stalled_ms, stop_ms - half_tick_ms - 1.0) << "stopped " << stop_ms << " ms";
  // Above it: the time the process waited for a CPU after SIGCONT, small unless the machine is
  // very busy.
  EXPECT_LE(stalled_ms, stop_ms + 200.0) << "stopped " << stop_ms << " ms";
}
#endif

TEST(PhaseTimes, KeepsForwardAndBackwardSpansWhenAsked) {
  PhaseTimes times(Clock::now());
  Clock::time_point t = Clock::now();
  t = times.mark(Phase::kForward, t);
  EXPECT_TRUE(times.take_work_spans().empty());  // not asked yet
  times.keep_work_spans();
  const Clock::time_point start = t;
  t = times.mark(Phase::kForward, t);
  t = times.mark(Phase::kBackward, t);
  const Clock::time_point compute_end = t;
  t = times.mark(Phase::kCommExposed, t);
  const Clock::time_point second = t;
  t = times.mark(Phase::kForward, t);
  const std::vector<TimeSpan> spans = times.take_work_spans();
  ASSERT_EQ(spans.size(), 2u);  // forward and backward merged, the next forward apart
  EXPECT_EQ(spans[0].start, start);
  EXPECT_EQ(spans[0].end, compute_end);
  EXPECT_EQ(spans[1].start, second);
  EXPECT_EQ(spans[1].end, t);
  EXPECT_TRUE(times.take_work_spans().empty());
}

}  // namespace
}  // namespace partrain
