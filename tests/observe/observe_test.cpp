// trainer/observe without LibTorch: the breakdown adds up, the trace window holds only its
// steps, the clock estimate recovers a known skew through a file store and a tcp store, the
// straggler rule names a rank that is late and only then, trace.json loads in Python and reads
// back, and explain's sentences carry the figures they rest on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"
#include "trainer/observe/clock_sync.h"
#include "trainer/observe/explain.h"
#include "trainer/observe/flight_recorder.h"
#include "trainer/observe/phase_times.h"
#include "trainer/observe/straggler.h"
#include "trainer/observe/trace_format.h"

namespace partrain {
namespace {

using std::chrono::milliseconds;

void busy(milliseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

TEST(PhaseTimes, PartsAddUpToTheWallTime) {
  PhaseTimes times(Clock::now());
  const auto from = times.snapshot();
  Clock::time_point t = Clock::now();
  busy(milliseconds(3));
  t = times.mark(Phase::kForward, t);
  busy(milliseconds(2));
  t = times.mark(Phase::kBackward, t);
  busy(milliseconds(4));  // unmarked: other
  t = Clock::now();
  busy(milliseconds(1));
  times.mark(Phase::kOptimizer, t);
  const auto to = times.snapshot();
  const Breakdown b = breakdown_between(from, to);
  EXPECT_GE(b.forward, 0.003);
  EXPECT_GE(b.backward, 0.002);
  EXPECT_GE(b.optimizer, 0.001);
  EXPECT_GE(b.other, 0.004);
  EXPECT_EQ(b.data_wait, 0.0);
  EXPECT_NEAR(b.total(), std::chrono::duration<double>(to.at - from.at).count(), 1e-9);
}

TEST(PhaseTimes, TraceKeepsOnlyItsStepsAndItsBound) {
  PhaseTimes times;
  times.trace_steps(2, 3, 5);
  for (std::int64_t step = 0; step < 6; ++step) {
    times.set_step(step);
    const auto t = Clock::now();
    times.mark(Phase::kForward, t);
    times.add_collectives(step, {BucketTiming{64, t, t}, BucketTiming{128, t, t}});
  }
  // Steps 2 and 3: 3 spans each, 6 in all, one over the bound of 5.
  ASSERT_EQ(times.spans().size(), 5u);
  EXPECT_EQ(times.dropped_spans(), 1u);
  for (const TimedSpan& s : times.spans()) {
    EXPECT_GE(s.step, 2);
    EXPECT_LE(s.step, 3);
  }
  EXPECT_EQ(times.spans()[1].collective, 0);
  EXPECT_EQ(times.spans()[2].bytes, 128u);
}

TEST(ClockSync, OffsetOfOneRoundTrip) {
  // Rank r's clock reads 10 s more than rank 0's; each leg takes 1 ms.
  ClockProbe p{100.0, 90.001, 90.002, 100.003};
  EXPECT_NEAR(clock_offset_of(p), 10.0, 1e-12);
  EXPECT_NEAR(p.round_trip(), 0.002, 1e-12);
}

// Ranks of one process with clocks skewed by known amounts recover the skews through the
// store: through a file store by rank 0's answers in turn, through a tcp store each against
// the server's clock (read here, as it is this process's, or through round trips as a rank on
// another host reads it).
void expect_skews_recovered(const std::string& url, bool host_server, bool clock_here = true) {
  SCOPED_TRACE(host_server ? (clock_here ? "tcp, clock read here" : "tcp, through round trips")
                           : (clock_here ? "file, one clock" : "file, through round trips"));
  constexpr int kWorld = 3;
  const double skew[kWorld] = {0.0, 5.0, -2.5};
  ClockEstimate estimate[kWorld];
  std::unique_ptr<comm::Store> server;
  comm::StoreOptions options;
  options.token = "clock-test";
  options.timeout = milliseconds(20000);
  options.world_size = kWorld;
  options.read_shared_clock_here = clock_here;
  std::string at = url;
  if (host_server) {
    comm::StoreOptions host = options;
    host.host_server = true;
    auto tcp = std::make_unique<comm::TcpStore>("127.0.0.1", 0, host);
    at = "tcp://127.0.0.1:" + std::to_string(tcp->port());
    server = std::move(tcp);
  }
  testing::run_ranks(kWorld, [&](int rank) {
    comm::StoreOptions mine = options;
    mine.rank = rank;
    auto store = comm::open_store(at, mine);
    // Without clock_here, each rank names a clock of its own, as ranks on other hosts would.
    const std::string clock = clock_here ? "" : "clock of rank " + std::to_string(rank);
    estimate[rank] = estimate_clock_offset(
        *store, rank, kWorld, 8,
        [&](Clock::time_point t) {
          return std::chrono::duration<double>(t.time_since_epoch()).count() + skew[rank];
        },
        clock);
  });
  EXPECT_EQ(estimate[0].offset_s, 0.0);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_NEAR(estimate[r].offset_s, skew[r], 0.003) << "rank " << r;
    if (clock_here) {  // the server's or rank 0's clock is the ranks': read, not estimated
      EXPECT_NEAR(estimate[r].offset_s, skew[r], 1e-6) << "rank " << r;
      EXPECT_EQ(estimate[r].round_trip_s, 0.0);
    } else {
      EXPECT_GT(estimate[r].round_trip_s, 0.0);
    }
    EXPECT_LT(estimate[r].round_trip_s, 0.05);
  }
}

TEST(ClockSync, RecoversASkewThroughAFileStore) {
  testing::ScratchDir one;
  expect_skews_recovered(one.url(), false);
  testing::ScratchDir other;
  expect_skews_recovered(other.url(), false, false);
}

TEST(ClockSync, RecoversASkewThroughTheTcpStoresClock) {
  expect_skews_recovered("", true);
  expect_skews_recovered("", true, false);
}

TEST(Straggler, NamesTheRankThatIsLate) {
  StragglerCount count(3);
  for (int step = 0; step < 50; ++step) {
    const double t = step;
    // Rank 2 is 10 ms behind rank 1, which is 1 ms behind rank 0; every 10th step rank 0 is last.
    if (step % 10 == 0) {
      count.add_step(std::vector<double>{t + 0.020, t + 0.001, t + 0.011});
    } else {
      count.add_step(std::vector<double>{t, t + 0.001, t + 0.011});
    }
  }
  EXPECT_EQ(count.steps(), 50);
  EXPECT_EQ(count.steps_last(2), 45);
  EXPECT_EQ(count.steps_last(0), 5);
  EXPECT_NEAR(count.seconds_cost(2), 45 * 0.010, 1e-9);
  EXPECT_NEAR(count.seconds_cost(0), 5 * 0.009, 1e-9);
  const std::optional<Straggler> s = count.verdict(10.0);  // cost 0.45 s of 10 s: 4.5%
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->steps_last, 45);
  EXPECT_EQ(s->steps, 50);
  // The same lateness in a run 100 times longer costs too little to matter.
  EXPECT_FALSE(count.verdict(1000.0).has_value());
}

TEST(Straggler, EvenRanksHaveNone) {
  StragglerCount count(2);
  for (int step = 0; step < 40; ++step) {
    const double late = 0.005;
    // Turn about: each rank last in half of the steps.
    count.add_step(step % 2 ? std::vector<double>{step + late, double(step)}
                            : std::vector<double>{double(step), step + late});
  }
  EXPECT_EQ(count.steps_last(0), 20);
  EXPECT_FALSE(count.verdict(1.0).has_value());  // cost 0.1 s of 1 s, but only 50% of steps
  StragglerCount one(1);
  one.add_step(std::vector<double>{1.0});
  EXPECT_FALSE(one.verdict(1.0).has_value());
  EXPECT_THROW(count.add_step(std::vector<double>{1.0}), Error);
}

// The live line: printed when the epoch's straggler changes, silent while it stays.
TEST(Straggler, ALineOnlyWhenTheStragglerChanges) {
  const std::optional<Straggler> none;
  const Straggler one{1, 18, 20, 2.126};
  const Straggler zero{0, 15, 20, 0.5};
  EXPECT_FALSE(straggler_change(none, none).has_value());
  EXPECT_EQ(straggler_change(none, one),
            "straggler: rank 1 was last at 18 of 20 steps this epoch; the others waited 2.13 s "
            "for it");
  EXPECT_FALSE(straggler_change(one, Straggler{1, 20, 20, 9.0}).has_value());
  EXPECT_EQ(straggler_change(one, zero).value_or("").rfind("straggler: rank 0 was last", 0), 0u);
  EXPECT_EQ(straggler_change(one, none),
            "straggler: none this epoch (rank 1 no longer holds the others up)");
}

std::vector<std::vector<TraceRecord>> two_rank_trace() {
  std::vector<std::vector<TraceRecord>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    const double late = r == 1 ? 0.004 : 0.0;
    ranks[r].push_back({static_cast<int>(Phase::kDataWait), -1, 7, 0, 10.000, 10.001});
    ranks[r].push_back({static_cast<int>(Phase::kForward), -1, 7, 0, 10.001, 10.003 + late});
    ranks[r].push_back({TraceRecord::kAllreduce, 0, 7, 4096, 10.003 + late, 10.008});
    ranks[r].push_back({TraceRecord::kAllreduce, 1, 7, 8192, 10.008, 10.010});
  }
  return ranks;
}

TEST(Trace, LoadsInPythonAndReadsBack) {
  // Packing for the gather keeps every field.
  const auto ranks = two_rank_trace();
  const std::vector<double> packed = pack_trace_records(ranks[1]);
  ASSERT_EQ(packed.size(), ranks[1].size() * kTraceRecordValues);
  const auto back = unpack_trace_records(packed.data(), ranks[1].size());
  EXPECT_EQ(back[2].kind, TraceRecord::kAllreduce);
  EXPECT_EQ(back[2].bucket, 0);
  EXPECT_EQ(back[2].step, 7);
  EXPECT_EQ(back[2].bytes, 4096);
  EXPECT_EQ(back[2].start_s, ranks[1][2].start_s);

  TraceInfo info;
  info.backend = "gloo";
  info.origin_s = 10.0;
  info.clock_offset_s = {0.0, 5.0};
  info.round_trip_s = {0.0, 0.0004};
  info.first_step = 7;
  info.last_step = 7;
  info.dropped = {0, 0};
  testing::ScratchDir dir;
  const std::string path = dir.write("trace.json", trace_to_json(ranks, info));
  const std::string check =
      "python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); ev=d['traceEvents'];"
      "x=[e for e in ev if e['ph']=='X'];"
      "assert len(x)==8 and all(k in e for e in x for k in ('name','ts','dur','pid','tid'));"
      "f=[e for e in x if e['pid']==1 and e['name']=='forward'][0];"
      "assert abs(f['ts']-1000)<1e-6 and abs(f['dur']-6000)<1e-6, f;"
      "a=[e for e in x if e['name']=='allreduce bucket 1'][0];"
      "assert a['args']=={'step':7,'bucket':1,'bytes':8192,'backend':'gloo'} and a['tid']==2;"
      "assert {e['args']['name'] for e in ev if e['ph']=='M' and e['name']=='process_name'}"
      "=={'rank 0','rank 1'}\" " +
      path;
  ASSERT_EQ(std::system(check.c_str()), 0);

  const TraceSummary s = read_trace_summary(path);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.first_step, 7);
  EXPECT_EQ(s.allreduces, 4u);
  EXPECT_EQ(s.matched, 2u);
  EXPECT_NEAR(s.arrival_spread_us, 2000.0, 1e-6);  // bucket 0: 4 ms apart, bucket 1: 0
  EXPECT_NEAR(s.allreduce_us, 5000 + 1000 + 2000 + 2000, 1e-6);
  EXPECT_EQ(s.allreduce_bytes, 4096 + 8192);

  const std::string bad = dir.write("bad.json", "{\"traceEvents\": [{\"ph\": \"X\", \"pid\": 0}]}");
  try {
    read_trace_summary(bad);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("traceEvents[0].name: missing"), std::string::npos)
        << e.what();
  }
}

RunReport report_with(const std::vector<Breakdown>& ranks, std::optional<Straggler> straggler) {
  RunReport report;
  report.path = "runs/x/report.json";
  report.summary.env.backend = "gloo";
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    RankRecord rr;
    rr.rank = static_cast<int>(r);
    rr.breakdown = ranks[r];
    report.summary.ranks.push_back(rr);
  }
  report.summary.straggler = straggler;
  report.config_leaves = {
      {"comm.wire_dtype", "f32"}, {"comm.bucket_mb", "25.0"}, {"data.num_workers", "1"}};
  return report;
}

// Where memory went: each rank's parts, rank 0's state against its activations, the spread of
// the peaks, and for an unsharded run what train.shard would take off; absent without a
// memory breakdown, in text and JSON alike.
TEST(Explain, WhereMemoryWent) {
  Breakdown b;
  b.forward = b.backward = 1;
  RunReport report = report_with({b, b}, std::nullopt);
  const std::string without = explain_run(report, nullptr);
  EXPECT_EQ(without.find("Where memory went"), std::string::npos) << without;
  for (RankRecord& r : report.summary.ranks) {
    MemoryBreakdown m;
    m.floor = 170;
    m.data = 30;
    m.parameters = 179;
    m.gradients = 179;
    m.optimizer_state = 358;
    m.activations = 80;
    m.unexplained = r.rank == 0 ? 24 : 4;
    r.memory = m;
    r.peak_rss_mb = 1020 + (r.rank == 0 ? 20 : 0);
  }
  const Explanation ex = explain(report, nullptr);
  EXPECT_NE(ex.text.find("Where memory went"), std::string::npos) << ex.text;
  EXPECT_NE(ex.text.find("parameters, gradients and optimizer state 716 MiB, the step's "
                         "activations 80 MiB, LibTorch's floor 170 MiB"),
            std::string::npos)
      << ex.text;
  EXPECT_NE(ex.text.find("within 2.0% of each other (1020 to 1040 MiB)"), std::string::npos)
      << ex.text;
  EXPECT_NE(ex.text.find("train.shard optimizer would keep 1/2 of the optimizer state on each "
                         "rank (179 MiB less)"),
            std::string::npos)
      << ex.text;
  const auto j = explanation_to_json(ex, report);
  ASSERT_TRUE(j["memory"].is_array());
  EXPECT_EQ(j["memory"][1]["optimizer_state_mb"], 358.0);
  report.config_leaves["train.shard"] = "optimizer";
  EXPECT_EQ(explain_run(report, nullptr).find("would keep"), std::string::npos);
}

TEST(Explain, CommunicationBoundRun) {
  Breakdown b;
  b.forward = 2;
  b.backward = 3;
  b.comm_exposed = 4;
  b.optimizer = 0.5;
  b.other = 0.5;  // total 10 s
  const std::string text = explain_run(report_with({b, b}, std::nullopt), nullptr);
  EXPECT_NE(text.find("   0    10.00"), std::string::npos) << text;
  EXPECT_NE(text.find("exposed communication 40.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("The largest part is comm_exposed: 40.0% (4.00 s)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("comm.wire_dtype bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("comm.bucket_mb is 25.0"), std::string::npos) << text;
  EXPECT_NE(text.find("No straggler"), std::string::npos) << text;
  EXPECT_EQ(text.find("loader threads"), std::string::npos) << text;
  EXPECT_NE(text.find("Verdict: communication"), std::string::npos) << text;
}

// A rank away for whole steps: last in under half of them, yet the others lost the most time
// to it, and it is named "away", not "slow".
TEST(Straggler, ARankAwayForWholeStepsIsNamedByTheTimeItCost) {
  StragglerCount count(2);
  double t = 0;
  for (int step = 0; step < 100; ++step) {
    t += 0.010;  // steps of 10 ms
    if (step % 10 == 9) {
      t += 0.060;  // rank 1 stopped for 60 ms, once in 10 steps
      count.add_step(std::vector<double>{t - 0.060, t});
    } else if (step % 2 == 0) {
      count.add_step(std::vector<double>{t + 0.0005, t});  // the ranks take turns by 0.5 ms
    } else {
      count.add_step(std::vector<double>{t, t + 0.0005});
    }
  }
  EXPECT_LT(count.steps_last(1), 60);  // the old rule (last in > 60 % of steps) missed it
  const std::optional<Straggler> s = count.verdict(2.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->kind, "away");
  EXPECT_EQ(s->steps_away, 10);
  EXPECT_NEAR(s->median_step_seconds, 0.010, 0.001);
  EXPECT_NEAR(s->seconds_cost, 10 * 0.060 + 40 * 0.0005, 1e-9);
  EXPECT_EQ(straggler_change(std::nullopt, s)
                .value_or("")
                .rfind("straggler: rank 1 was away for whole steps this epoch (10 steps late", 0),
            0u);

  // Late by 3 ms at every step of 10: slower, not away.
  StragglerCount steady(2);
  for (int step = 0; step < 50; ++step) {
    steady.add_step(std::vector<double>{0.013 * step, 0.013 * step + 0.003});
  }
  const std::optional<Straggler> slow = steady.verdict(1.0);
  ASSERT_TRUE(slow.has_value());
  EXPECT_EQ(slow->kind, "slow");
  EXPECT_EQ(slow->steps_away, 0);
}

// A pair and its single-device baseline: the speed-up, the ideal from the threads and cores,
// and parts that add up to the gap.
RunReport timed_report(const std::vector<Breakdown>& ranks, double total_seconds, double images,
                       int batch, int threads) {
  RunReport report = report_with(ranks, std::nullopt);
  report.path = ranks.size() == 1 ? "runs/x/baseline/report.json" : "runs/x/report.json";
  report.batch_size = batch;
  report.summary.env.world_size = static_cast<int>(ranks.size());
  report.summary.total_seconds = total_seconds;
  EpochRecord e;
  e.images = static_cast<std::int64_t>(images);
  e.steps = 100;
  e.train_seconds = ranks[0].total() - ranks[0].evaluation;
  report.summary.epochs.push_back(e);
  report.summary.images_per_s = images / e.train_seconds;
  for (RankRecord& r : report.summary.ranks) {
    r.device = "cpu";
    r.threads = threads;
    r.host_cores = 2;
    r.ranks_on_host = static_cast<int>(ranks.size());
  }
  report.config_leaves["model.name"] = "digitalnet";
  report.config_leaves["data.dataset"] = "synthetic";
  return report;
}

TEST(Explain, TheSpeedupDecomposedAddsUpToTheGap) {
  Breakdown one;  // the baseline: 12800 images in 20 s of epochs, 21 s in all
  one.forward = 6;
  one.backward = 10;
  one.optimizer = 1;
  one.data_wait = 1;
  one.evaluation = 1;
  one.other = 1;
  const RunReport baseline = timed_report({one}, 21.0, 12800, 128, 1);
  Breakdown half;  // each rank: forward+backward per sample 1.25x, comm exposed 1.5 s
  half.forward = 3.75;
  half.backward = 6.25;
  half.optimizer = 1;  // the whole step, at every one of the 100 steps
  half.comm_exposed = 1.5;
  half.data_wait = 0.5;
  half.evaluation = 0.5;
  half.other = 0.5;
  const RunReport pair = timed_report({half, half}, 15.5, 12800, 64, 1);

  const Scaling sc = decompose_speedup(pair, baseline);
  EXPECT_DOUBLE_EQ(sc.ideal, 2.0);  // 2 ranks of 1 thread against 1 thread
  EXPECT_NEAR(sc.speedup, 21.0 / 15.5, 1e-9);
  double sum = 0;
  std::map<std::string, double> parts;
  for (const ScalingPart& p : sc.parts) {
    sum += p.speedup;
    parts[p.name] = p.speedup;
  }
  EXPECT_NEAR(sum, sc.ideal - sc.speedup, 1e-9);
  // Each part: I (x - y / I) / t with t = 15.5 s for the same images.
  EXPECT_NEAR(parts["communication"], 2 * 1.5 / 15.5, 1e-9);
  EXPECT_NEAR(parts["compute"], 2 * (10 - 16 / 2.0) / 15.5, 1e-9);
  EXPECT_NEAR(parts["optimizer"], 2 * (1 - 0.5) / 15.5, 1e-9);
  EXPECT_NEAR(parts["startup"], 2 * (1.5 - 0.5) / 15.5, 1e-9);  // 15.5 - 14 against 21 - 20
  EXPECT_NEAR(parts["straggler"], 0, 1e-12);
  EXPECT_NEAR(parts["data"], 0, 1e-12);

  const Explanation ex = explain(pair, nullptr, nullptr, &baseline);
  EXPECT_EQ(ex.cause, "compute");  // 0.26x of the 0.65x missing
  EXPECT_NE(ex.text.find("Speed-up over the single-device run (runs/x/baseline/report.json): "
                         "1.35x of an ideal 2.00x"),
            std::string::npos)
      << ex.text;
  EXPECT_NE(ex.text.find("forward+backward 1.562 ms a sample on each rank against 1.250 ms in the "
                         "baseline (1.25x), at a batch of 64 a rank against 128"),
            std::string::npos)
      << ex.text;
  EXPECT_NE(ex.text.find("measures one rank's batch alone too"), std::string::npos) << ex.text;
  const nlohmann::ordered_json j = explanation_to_json(ex, pair);
  EXPECT_EQ(j["schema"], "partrain.explain/1");
  EXPECT_EQ(j["verdict"]["cause"], "compute");
  EXPECT_TRUE(j["straggler"].is_null());
  EXPECT_NEAR(j["scaling"]["gap"].get<double>(), sc.ideal - sc.speedup, 1e-9);
  EXPECT_NEAR(j["scaling"]["parts"]["communication"].get<double>(), 2 * 1.5 / 15.5, 1e-9);

  // Threads left to the default: the single process had both cores, the pair one each.
  RunReport auto_base = baseline;
  auto_base.summary.ranks[0].threads = 2;
  EXPECT_DOUBLE_EQ(decompose_speedup(pair, auto_base).ideal, 1.0);
  // Not a baseline: two ranks, or another model.
  EXPECT_THROW(decompose_speedup(pair, pair), UsageError);
  RunReport other = baseline;
  other.config_leaves["model.name"] = "resnet18";
  EXPECT_THROW(decompose_speedup(pair, other), UsageError);
}

// The compute probe (one process at one rank's batch and threads, alone) splits the compute
// part in two that add up to it: the smaller batch (probe against baseline) and the ranks'
// contention (run against probe); the advice follows whichever is large.
TEST(Explain, TheComputeProbeSplitsBatchFromContention) {
  Breakdown one;
  one.forward = 6;
  one.backward = 10;
  one.optimizer = 1;
  one.data_wait = 1;
  one.evaluation = 1;
  one.other = 1;
  const RunReport baseline = timed_report({one}, 21.0, 12800, 128, 1);
  Breakdown half;  // 10 s of forward+backward for 6400 images: 1.5625 ms a sample
  half.forward = 3.75;
  half.backward = 6.25;
  half.optimizer = 1;
  half.comm_exposed = 1.5;
  half.data_wait = 0.5;
  half.evaluation = 0.5;
  half.other = 0.5;
  const RunReport pair = timed_report({half, half}, 15.5, 12800, 64, 1);
  Breakdown alone;  // the probe: 2560 images at batch 64 in 3.52 s, 1.375 ms a sample
  alone.forward = 1.32;
  alone.backward = 2.2;
  alone.optimizer = 0.4;
  RunReport probe = timed_report({alone}, 5.0, 2560, 64, 1);
  probe.path = "runs/x/baseline-rank-batch/report.json";

  const Scaling without = decompose_speedup(pair, baseline);
  const Scaling sc = decompose_speedup(pair, baseline, &probe);
  std::map<std::string, double> parts, whole;
  double sum = 0;
  for (const ScalingPart& p : sc.parts) {
    parts[p.name] = p.speedup;
    sum += p.speedup;
  }
  for (const ScalingPart& p : without.parts) whole[p.name] = p.speedup;
  EXPECT_EQ(parts.count("compute"), 0u);
  EXPECT_NEAR(sum, sc.ideal - sc.speedup, 1e-9);
  EXPECT_NEAR(parts["compute_batch"] + parts["compute_contention"], whole["compute"], 1e-9);
  // Batch: 1.375 ms alone at 64 against 1.25 ms at 128, over the rank's 6400 images.
  EXPECT_NEAR(parts["compute_batch"], 2 * (6400 * 1.375e-3 - 16 / 2.0) / 15.5, 1e-9);
  // Contention: 1.5625 ms beside the other rank against 1.375 ms alone.
  EXPECT_NEAR(parts["compute_contention"], 2 * (10 - 6400 * 1.375e-3) / 15.5, 1e-9);

  const Explanation ex = explain(pair, nullptr, nullptr, &baseline, &probe);
  EXPECT_EQ(ex.cause, "compute");
  EXPECT_NE(ex.text.find("forward+backward 1.562 ms a sample on each rank beside the others "
                         "against 1.375 ms alone at the same batch and threads (1.14x)"),
            std::string::npos)
      << ex.text;
  bool contention_advice = false;
  for (const Advice& a : ex.advice) contention_advice |= a.action == "ranks_per_host";
  EXPECT_TRUE(contention_advice) << ex.text;
  EXPECT_EQ(ex.text.find("measures one rank's batch alone too"), std::string::npos) << ex.text;
  const nlohmann::ordered_json j = explanation_to_json(ex, pair);
  EXPECT_TRUE(j["scaling"]["parts"].contains("compute_contention"));
  // A probe of another model is refused.
  RunReport other = probe;
  other.config_leaves["model.name"] = "resnet18";
  EXPECT_THROW(decompose_speedup(pair, baseline, &other), UsageError);
}

// With a straggler the parts are read off the ranks that waited: its cost is the straggler part,
// not a slower compute; and a rank that is away gets no wire advice.
TEST(Explain, AnAwayRankIsTheCauseAndGetsNoWireAdvice) {
  Breakdown one;
  one.forward = 6;
  one.backward = 10;
  one.other = 4;
  const RunReport baseline = timed_report({one}, 21.0, 12800, 128, 1);
  Breakdown waiting, away;
  waiting.forward = 3;
  waiting.backward = 5;
  waiting.comm_exposed = 6;  // 5 s of it waiting for rank 1
  waiting.other = 2;
  away = waiting;
  away.forward = 8;  // stopped in its forward
  away.comm_exposed = 1;
  RunReport pair = timed_report({waiting, away}, 17.0, 12800, 64, 1);
  Straggler g{1, 40, 100, 5.0};
  g.kind = "away";
  g.steps_away = 10;
  g.median_step_seconds = 0.01;
  pair.summary.straggler = g;
  const Explanation ex = explain(pair, nullptr, nullptr, &baseline);
  EXPECT_EQ(ex.cause, "straggler") << ex.text;
  std::map<std::string, double> parts;
  for (const ScalingPart& p : ex.scaling->parts) parts[p.name] = p.speedup;
  EXPECT_NEAR(parts["straggler"], 2 * 5.0 / 17.0, 1e-9);
  EXPECT_NEAR(parts["compute"], 0, 1e-9);  // rank 0's 8 s is half the baseline's 16
  EXPECT_NE(ex.text.find("Rank 1 was absent for whole steps"), std::string::npos) << ex.text;
  EXPECT_EQ(ex.text.find("comm.wire_dtype bf16"), std::string::npos) << ex.text;
  EXPECT_EQ(ex.text.find("powersgd"), std::string::npos) << ex.text;
  const nlohmann::ordered_json j = explanation_to_json(ex, pair);
  EXPECT_EQ(j["straggler"]["rank"], 1);
  EXPECT_EQ(j["straggler"]["kind"], "away");
  // Beyond the measured wait, 4 s more exposed (a quarter of the training): with the rank away
  // that is its absences inside the collectives too, so still no wire or compression advice.
  RunReport longer = pair;
  longer.summary.ranks[0].breakdown->comm_exposed = 10;
  longer.summary.ranks[0].comm_busy_seconds = 4.5;
  const Explanation still = explain(longer, nullptr);
  EXPECT_EQ(still.text.find("comm.wire_dtype bf16"), std::string::npos) << still.text;
  EXPECT_EQ(still.text.find("powersgd"), std::string::npos) << still.text;
  EXPECT_NE(still.text.find("while that rank is away for whole steps"), std::string::npos)
      << still.text;
}

// The wire's prediction: half the busy time, backward hiding what it hides now.
TEST(Explain, TheWirePredictionFollowsTheBusyTime) {
  Breakdown b;
  b.forward = 2;
  b.backward = 3;
  b.comm_exposed = 4;
  b.other = 1;
  RunReport report = report_with({b, b}, std::nullopt);
  for (RankRecord& r : report.summary.ranks) {
    r.comm_busy_seconds = 6;  // 2 s hidden under backward
    r.comm_bytes = 1'000'000;
    r.comm_buckets = 10;
  }
  const Explanation ex = explain(report, nullptr);
  bool found = false;
  for (const Advice& a : ex.advice) {
    if (a.action != "comm.wire_dtype=bf16") continue;
    found = true;
    EXPECT_NEAR(a.saves_seconds, 4 - (3 - 2), 1e-9);  // busy 6 -> 3, exposed 4 -> 1
  }
  EXPECT_TRUE(found) << ex.text;
}

TEST(Explain, DataBoundRunWithAStraggler) {
  Breakdown fast, slow;
  fast.forward = fast.backward = 4;
  fast.comm_exposed = 1.5;
  fast.other = 0.5;
  slow.forward = slow.backward = 4;
  slow.data_wait = 2;  // 20% of 10 s
  const std::string text =
      explain_run(report_with({fast, slow}, Straggler{1, 90, 100, 1.5}), nullptr);
  EXPECT_EQ(text.find("Rank 1 waited for data"), std::string::npos) << text;  // told once
  EXPECT_NE(text.find("data.num_workers is 1"), std::string::npos) << text;
  // Held against rank 0's 10 s, the ranks that waited.
  EXPECT_NE(text.find("Rank 1 was the straggler: the others waited 1.50 s for it (15.0% of their "
                      "training); it was slower at every step: last at 90 of 100 steps."),
            std::string::npos)
      << text;
  // Its lateness is its data wait: 2 s more than rank 0's.
  EXPECT_NE(text.find("Its data_wait is 2.00 s longer than the others'. More loader threads"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Verdict: straggler"), std::string::npos) << text;
  EXPECT_EQ(text.find("comm.wire_dtype"), std::string::npos) << text;  // 7.5%: not called out

  // Rank 0 spends 5.5 s of 10 in finish_backward, 5 s of it waiting for rank 1: the wire is
  // not the problem.
  Breakdown waiting = fast;
  waiting.forward = waiting.backward = 2;
  waiting.comm_exposed = 5.5;
  const std::string waited =
      explain_run(report_with({waiting, slow}, Straggler{1, 90, 100, 5.0}), nullptr);
  EXPECT_NE(waited.find("Exposed communication is 55.0% of training, but 50.0% of it is the "
                        "wait for rank 1: the transfer itself is 5.0%"),
            std::string::npos)
      << waited;
  EXPECT_EQ(waited.find("comm.wire_dtype"), std::string::npos) << waited;

  // Rank 0 slower in its own compute than rank 1 (a host shared with other work) waits only
  // 1 s of rank 1's 3 s of data wait. Over both ranks data wait is 16% of training, more than
  // the 10% the wait costs; but rank 0's time is the run's, and rank 0 waited for no data.
  Breakdown busy = fast;
  busy.comm_exposed = 1;
  Breakdown hungry = slow;
  hungry.forward = hungry.backward = 3;
  hungry.data_wait = 3;
  const std::string hidden =
      explain_run(report_with({busy, hungry}, Straggler{1, 90, 100, 1.0}), nullptr);
  EXPECT_NE(hidden.find("data wait 16.2%"), std::string::npos) << hidden;
  EXPECT_NE(hidden.find("Verdict: straggler (straggler takes 10.5% of training)"),
            std::string::npos)
      << hidden;
  EXPECT_NE(hidden.find("Its data_wait is 3.00 s longer than the others'"), std::string::npos)
      << hidden;

  RunReport old = report_with({fast}, std::nullopt);
  old.summary.ranks[0].breakdown.reset();
  EXPECT_THROW(explain_run(old, nullptr), UsageError);
}

// The gradients' busbw from the ranks' bytes and busy time, held against bench allreduce.
TEST(Explain, BusbwAgainstTheBench) {
  Breakdown b;
  b.forward = b.backward = 4;
  b.other = 2;
  RunReport report = report_with({b, b}, std::nullopt);
  for (RankRecord& r : report.summary.ranks) {
    r.comm_bytes = 400'000'000;  // 40 buckets of 10 MB
    r.comm_buckets = 40;
    r.comm_busy_seconds = 2.0;
  }
  // 2(W-1)/W = 1 for two ranks: 0.4 GB in 2 s.
  EXPECT_DOUBLE_EQ(achieved_busbw_gbps(report.summary.ranks[0], 2), 0.2);
  const std::string alone = explain_run(report, nullptr);
  EXPECT_NE(alone.find("moved 400.0 MB per rank in 40 bucket collectives of 10.00 MB on "
                       "average; busbw achieved 0.200 GB/s"),
            std::string::npos)
      << alone;

  testing::ScratchDir dir;
  const std::string path = dir / "bench.json";
  std::ofstream(path) << R"({"schema": "partrain.bench/1", "collective": "allreduce", "world": 2,
    "dtype": "f32", "wire_dtype": "f32", "results": [
    {"backend": "gloo", "bytes": 1048576, "busbw_gbps": 0.1},
    {"backend": "gloo", "bytes": 16777216, "busbw_gbps": 0.25},
    {"backend": "asio-ring", "bytes": 10000000, "busbw_gbps": 9.0}]})";
  const BenchReport bench = read_bench_report(path);
  const std::string held = explain_run(report, nullptr, &bench);
  // The nearest gloo size to 10 MB is 16 MiB: 0.2 of 0.25 GB/s.
  EXPECT_NE(held.find("measured 0.250 GB/s for gloo at 16.78 MB with 2 ranks: the training "
                      "reached 80% of it."),
            std::string::npos)
      << held;
  EXPECT_EQ(held.find("not quite the same"), std::string::npos) << held;

  std::ofstream(path) << R"({"schema": "partrain.report/1"})";
  EXPECT_THROW(read_bench_report(path), UsageError);
}

// The ring keeps the last kCapacity collectives, oldest first, with the step they belong to;
// one that never returned stays open.
TEST(FlightRecorder, KeepsTheLastCollectives) {
  FlightRecorder recorder;
  EXPECT_TRUE(recorder.entries().empty());
  EXPECT_EQ(describe_flight(recorder.entries(), 0), "no collective recorded");
  for (int i = 0; i < 100; ++i) {
    recorder.set_step(i / 4);
    // The caller marks what the collective is for; the communicator records it.
    const std::uint64_t mark =
        recorder.enter(i % 4 == 3 ? FlightOp::kStepExchange : FlightOp::kAllreduce,
                       i % 4 == 3 ? -1 : i % 4, 1000 * static_cast<std::size_t>(i));
    const std::uint64_t order =
        recorder.begin(1, static_cast<std::uint64_t>(i + 1), comm::CollectiveKind::allreduce,
                       1000 * static_cast<std::size_t>(i));
    EXPECT_EQ(order, static_cast<std::uint64_t>(i + 1));
    if (i < 99) recorder.end(order, "ring");
    recorder.leave(mark);
  }
  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(entries.front().seq, 100 - FlightRecorder::kCapacity + 1);
  EXPECT_EQ(entries.back().seq, 100u);
  EXPECT_EQ(entries.back().op, FlightOp::kStepExchange);
  EXPECT_EQ(entries.back().step, 24);
  EXPECT_EQ(entries.back().bytes, 99000u);
  EXPECT_LT(entries.back().end_s, 0);  // never left
  EXPECT_GE(entries[entries.size() - 2].end_s, entries[entries.size() - 2].start_s);
  EXPECT_EQ(entries[entries.size() - 2].bucket, 2);
  const std::string where = describe_flight(entries, entries.back().start_s + 5.04);
  EXPECT_EQ(where, "in step exchange #100 (step 24, 99000 bytes) for 5.0 s");
  EXPECT_EQ(entries[entries.size() - 2].algorithm_name(), "ring");
  recorder.end(100, "recursive_doubling");
  EXPECT_EQ(describe_flight(recorder.entries(), recorder.entries().back().end_s + 2),
            "after step exchange #100 (step 24, 99000 bytes), 2.0 s ago");
}

std::vector<FlightEntry> flight_up_to(std::uint64_t last, bool open) {
  std::vector<FlightEntry> entries;
  for (std::uint64_t seq = last - 2; seq <= last; ++seq) {
    FlightEntry e;
    e.seq = seq;
    e.bucket = static_cast<int>(seq % 3);
    e.bytes = 2'000'000;
    e.step = static_cast<std::int64_t>(seq / 3);
    e.start_s = 1000.0 + static_cast<double>(seq);
    e.end_s = seq == last && open ? -1 : e.start_s + 0.5;
    entries.push_back(e);
  }
  return entries;
}

// explain reads the dumps back: the rank furthest behind is named, and so is a rank that left
// none; the dumps are atomic files of their own format.
TEST(FlightRecorder, ExplainNamesWhoHeldTheOthersUp) {
  testing::ScratchDir dir("partrain-flight");
  const std::string out = dir.path().string();
  const std::string p0 = dump_flight(out, 0, 3, "timed out", flight_up_to(136, true));
  EXPECT_EQ(p0, out + "/flight/rank-0.json");
  dump_flight(out, 1, 3, "lost rank 2", flight_up_to(135, true));
  const std::string behind = explain_flight(out + "/flight");
  EXPECT_NE(behind.find("Flight records (2 of 3 ranks)"), std::string::npos) << behind;
  EXPECT_NE(behind.find("rank 2: no record"), std::string::npos) << behind;
  EXPECT_NE(behind.find("The others waited for rank 2, which left no record (frozen or killed); "
                        "rank 1 stood at allreduce #135 (step 45, bucket 0, 2.0 MB), rank 0 had "
                        "entered #136 (allreduce)."),
            std::string::npos)
      << behind;

  dump_flight(out, 2, 3, "lost rank 1", flight_up_to(136, false));
  const std::string all = explain_flight(out + "/flight");
  EXPECT_NE(all.find("  rank 2: after allreduce #136 (step 45, bucket 1, 2.0 MB)"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("Rank 1 held the others up: rank 1 stood at allreduce #135 (step 45, "
                     "bucket 0, 2.0 MB), ranks 0, 2 had entered #136 (allreduce)."),
            std::string::npos)
      << all;

  EXPECT_THROW(explain_flight(out), UsageError);  // no rank-R.json right there
  dir.write("flight/rank-3.json", "{\"schema\": \"other\"}");
  EXPECT_THROW(explain_flight(out + "/flight"), UsageError);
}

}  // namespace
}  // namespace partrain
