// Where a run's time goes, end to end on 2 CPU ranks: the breakdown in report.json and
// metrics.jsonl, trace.json on one clock (with rank 1's clock skewed on purpose), the
// straggler verdict (with rank 1 slowed on purpose), `partrain explain` on the result, and
// TensorBoard's event file read back without partrain's code (tests/observe/check_tfevents.py);
// and on 3 ranks, the flight records a frozen rank leaves behind on the others.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/train/run_harness.h"

namespace partrain_test {
namespace {

const char* const kParts[] = {"data_wait", "forward",    "backward",   "comm_exposed",
                              "optimizer", "evaluation", "checkpoint", "other"};

std::string two_rank_config() {
  return "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
         "train: {epochs: 2, threads: 1}\n";
}

// Each rank's parts are >= 0 and add up to its total; the total is the training's wall time,
// so it lies between the epochs' own times and the whole run's.
void expect_breakdown_adds_up(const Json& report) {
  double epochs_seconds = 0;
  for (const auto& e : report["epochs"]) epochs_seconds += e["seconds"].get<double>();
  ASSERT_EQ(report["ranks"].size(), 2u);
  for (const auto& rank : report["ranks"]) {
    ASSERT_TRUE(rank.contains("breakdown")) << rank.dump();
    const Json& b = rank["breakdown"];
    double sum = 0;
    for (const char* part : kParts) {
      ASSERT_TRUE(b.contains(part)) << part;
      EXPECT_GE(b[part].get<double>(), 0.0) << part;
      sum += b[part].get<double>();
    }
    const double total = b["total"].get<double>();
    EXPECT_NEAR(sum, total, 0.01 * total);
    EXPECT_GE(total, 0.99 * epochs_seconds);
    EXPECT_LE(total, report["total_seconds"].get<double>());
    // A training run spends real time computing: both passes were measured.
    EXPECT_GT(b["forward"].get<double>(), 0.0);
    EXPECT_GT(b["backward"].get<double>(), 0.0);
    EXPECT_GT(b["evaluation"].get<double>(), 0.0);
  }
}

TEST(Observe, BreakdownAndTraceOnOneClock) {
  auto dir = scratch("observe_trace");
  auto cfg = write_config(dir, two_rank_config() + "observe: {trace_steps: [5, 24]}\n");
  constexpr double kSkew = 5.0;
  Result r;
  {
    ScopedEnv skew("PARTRAIN_TEST_CLOCK_SKEW", "1:5.0");
    r = partrain("run " + cfg.string() + " --trace", dir);
  }
  ASSERT_EQ(r.code, 0) << r.output;
  const Json report = read_report(dir);
  expect_breakdown_adds_up(report);
  EXPECT_TRUE(report.contains("straggler"));

  // metrics.jsonl: each epoch line holds both ranks' breakdowns of that epoch.
  std::ifstream metrics(dir / "out" / "metrics.jsonl");
  std::string line;
  int epoch_lines = 0;
  while (std::getline(metrics, line)) {
    const Json j = Json::parse(line);
    if (j["type"] != "epoch") continue;
    ++epoch_lines;
    ASSERT_EQ(j["breakdown"].size(), 2u) << line;
    for (const auto& b : j["breakdown"]) {
      for (const char* part : kParts) EXPECT_GE(b[part].get<double>(), 0.0) << line;
      EXPECT_GT(b["total"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(epoch_lines, 2);

  // trace.json loads in Python, with the fields a viewer needs.
  const fs::path trace = dir / "out" / "trace.json";
  const std::string check =
      "python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); ev=d['traceEvents'];"
      "x=[e for e in ev if e['ph']=='X']; m=[e for e in ev if e['ph']=='M'];"
      "assert x and all(isinstance(e[k],(int,float)) for e in x for k in ('ts','dur','pid','tid'));"
      "assert all(e['dur']>=0 and isinstance(e['name'],str) for e in x);"
      "names={e['args']['name'] for e in m if e['name']=='process_name'};"
      "assert names=={'rank 0','rank 1'}, names;"
      "threads={e['args']['name'] for e in m if e['name']=='thread_name'};"
      "assert threads=={'compute','communication','data'}, threads;"
      "a=[e for e in x if e['name'].startswith('allreduce')];"
      "assert a and all({'bytes','backend','bucket','step'}<=set(e['args']) for e in a)\" " +
      trace.string();
  ASSERT_EQ(std::system(check.c_str()), 0) << "trace.json failed the Python check";

  std::ifstream in(trace);
  const Json doc = Json::parse(in);
  // The estimate recovers the skew (both ranks share this machine's clock otherwise).
  const double offset = doc["otherData"]["clock_offset_s"][1].get<double>();
  EXPECT_NEAR(offset, kSkew, 0.005);
  // The same allreduce ends at nearly the same moment on both ranks (it cannot end on one
  // before the other has sent its part): on the common clock their ends line up, whereas
  // an uncorrected 5 s skew would put them 5 s apart.
  std::map<std::pair<long, long>, std::map<int, double>> ends;
  std::map<std::string, int> names;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++names[e["name"].get<std::string>()];
    EXPECT_GE(e["args"]["step"].get<long>(), 5);
    EXPECT_LE(e["args"]["step"].get<long>(), 24);
    if (e["name"].get<std::string>().rfind("allreduce", 0) != 0) continue;
    ends[{e["args"]["step"].get<long>(), e["args"]["bucket"].get<long>()}][e["pid"].get<int>()] =
        e["ts"].get<double>() + e["dur"].get<double>();
  }
  for (const char* name : {"data wait", "forward", "backward", "wait for gradients", "optimizer"}) {
    EXPECT_GT(names[name], 0) << name;
  }
  std::vector<double> gaps_us;
  for (const auto& [key, by_rank] : ends) {
    if (by_rank.size() == 2) gaps_us.push_back(std::abs(by_rank.at(0) - by_rank.at(1)));
  }
  ASSERT_GE(gaps_us.size(), 20u);  // 20 steps, every bucket on both ranks
  std::sort(gaps_us.begin(), gaps_us.end());
  EXPECT_LT(gaps_us[gaps_us.size() / 2], 5000.0) << "median gap of allreduce ends (us)";

  // explain reads the report and the trace.
  Result e = partrain(
      "explain " + (dir / "out" / "report.json").string() + " --trace " + trace.string(), dir);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("Where the time went"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("Trace (steps 5..24, 2 ranks)"), std::string::npos) << e.output;
}

// Every optimizer step's loss and learning rate, each epoch's test figures, throughput and
// rank 0's breakdown shares: the event file says what metrics.jsonl says.
TEST(Observe, TensorBoardEventsMatchMetrics) {
  auto dir = scratch("observe_tensorboard");
  auto cfg = write_config(dir,
                          "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
                          "train: {epochs: 2, threads: 1, log_every: 3}\n");
  Result r = partrain("run " + cfg.string(), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string check = "PROTOC=" PARTRAIN_PROTOC " python3 " PARTRAIN_SOURCE_DIR
                            "/tests/observe/check_tfevents.py " +
                            (dir / "out").string() + " --every-step > " +
                            (dir / "check.txt").string() + " 2>&1";
  const int status = std::system(check.c_str());
  std::ifstream in(dir / "check.txt");
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(status, 0) << said;
  // Two epochs of 19 steps (600 images a rank, 32 a batch): the version record, 38 steps and
  // 2 epochs; 2 step tags, 4 epoch tags and 8 breakdown parts.
  EXPECT_NE(said.find("41 records, 38 steps, 2 epochs, 14 tags"), std::string::npos) << said;
}

TEST(Observe, SlowRankIsNamedStraggler) {
  auto dir = scratch("observe_straggler");
  // Without observe.tensorboard there is no event file. One epoch of 19 steps, rank 1 100 ms
  // late at each: far more than what other work on a shared host makes one rank's compute
  // slower than the other's (20 ms a step seen on 2 cores), which the wait measured takes off.
  auto cfg = write_config(dir,
                          "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
                          "train: {epochs: 1, threads: 1}\nobserve: {tensorboard: false}\n");
  constexpr double kDelay = 0.1;
  Result r;
  {
    ScopedEnv delay("PARTRAIN_TEST_STEP_DELAY", "1:0.1");
    r = partrain("run " + cfg.string(), dir);
  }
  ASSERT_EQ(r.code, 0) << r.output;
  for (const auto& entry : fs::directory_iterator(dir / "out")) {
    EXPECT_EQ(entry.path().filename().string().rfind("events.out.tfevents", 0), std::string::npos)
        << entry.path();
  }
  const Json report = read_report(dir);
  expect_breakdown_adds_up(report);
  ASSERT_TRUE(report["straggler"].is_object()) << report["straggler"].dump();
  const Json& s = report["straggler"];
  EXPECT_EQ(s["rank"], 1);
  EXPECT_GT(s["steps_last"].get<double>(), 0.6 * s["steps"].get<double>());
  // Every step rank 1 is about 100 ms late: the others waited roughly that per step.
  const double steps = s["steps"].get<double>();
  EXPECT_GT(s["seconds_cost"].get<double>(), 0.5 * kDelay * steps);
  EXPECT_LT(s["seconds_cost"].get<double>(), 2.0 * kDelay * steps);
  // Rank 1's injected wait is data wait: it shows there, not on rank 0.
  EXPECT_GT(report["ranks"][1]["breakdown"]["data_wait"].get<double>(), 0.9 * kDelay * steps);

  Result e = partrain("explain " + (dir / "out" / "report.json").string(), dir);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("Rank 1 was the straggler"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("balance the ranks' work"), std::string::npos) << e.output;
  // Its lateness is the injected wait before each batch: data wait.
  EXPECT_NE(e.output.find("Its data_wait is"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("Verdict: straggler"), std::string::npos) << e.output;
}

// A rank frozen mid-run (SIGSTOP): the others' collectives time out, each dumps its last
// collectives to OUTPUT/flight/rank-R.json and says the frozen rank's process is stopped, the
// launcher's verdict says where they stood, and `partrain explain OUTPUT` names the frozen rank,
// which left no record.
TEST(Observe, FrozenRankLeavesFlightRecords) {
  auto dir = scratch("observe_flight");
  const fs::path cfg = write_config(
      dir, "strategy: ddp\nlaunch: {nproc_per_node: 3}\ntrain: {epochs: 2, threads: 1}\n");
  const fs::path log = dir / "run.txt";
  const pid_t launcher = start_partrain(
      {"run", cfg.string(), "--set", "comm.timeout_s=3", "--set", "data.synthetic_train=9600"},
      log);
  ASSERT_TRUE(wait_for_text(log, "epoch 1/2 step 40/", std::chrono::seconds(120)))
      << read_text(log);
  const pid_t victim = find_worker(launcher, 2);
  ASSERT_GT(victim, 0);
  kill(victim, SIGSTOP);
  const auto status = wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << read_text(log);
  const std::string out = read_text(log);
  EXPECT_EQ(WEXITSTATUS(*status), 1) << out;

  const fs::path flight = dir / "out" / "flight";
  EXPECT_FALSE(fs::exists(flight / "rank-2.json"));  // frozen: it could not write
  std::uint64_t stood_at[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(flight / ("rank-" + std::to_string(r) + ".json"));
    ASSERT_TRUE(in.good()) << "no flight record of rank " << r << "\n" << out;
    const Json doc = Json::parse(in);
    EXPECT_EQ(doc["schema"], "partrain.flight/1");
    EXPECT_EQ(doc["rank"], r);
    EXPECT_EQ(doc["world_size"], 3);
    const Json& c = doc["collectives"];
    ASSERT_EQ(c.size(), 64u) << "40 steps of buckets and step exchanges fill the ring";
    for (std::size_t i = 1; i < c.size(); ++i) {
      EXPECT_EQ(c[i]["seq"].get<std::uint64_t>(), c[i - 1]["seq"].get<std::uint64_t>() + 1);
      EXPECT_GE(c[i]["step"].get<std::int64_t>(), c[i - 1]["step"].get<std::int64_t>());
    }
    // Every collective but the last returned; the last was still waiting for rank 2.
    for (std::size_t i = 0; i + 1 < c.size(); ++i) EXPECT_TRUE(c[i]["end_s"].is_number()) << i;
    EXPECT_TRUE(c.back()["end_s"].is_null()) << c.back().dump();
    // Rank 0 prints "step 40/" when the 40th step's gradients are summed, before that step's
    // exchange (step index 39): rank 2 may have stopped before joining it.
    EXPECT_GE(c.back()["step"].get<std::int64_t>(), 39);
    stood_at[r] = c.back()["seq"].get<std::uint64_t>();
    // The launcher's verdict carries where this rank stood, as its dump says.
    const std::string where = "rank " + std::to_string(r) + " in " +
                              c.back()["op"].get<std::string>() + " #" +
                              std::to_string(stood_at[r]) + " (step ";
    EXPECT_NE(out.find(where), std::string::npos) << where << "\n" << out;
  }
  EXPECT_NE(out.find("; where the ranks stood: rank "), std::string::npos) << out;
  // The ranks that lost it share its machine: they looked at its process and say it is stopped.
  EXPECT_NE(out.find("rank 2 (pid " + std::to_string(victim) +
                     ", this machine) is stopped (SIGSTOP or SIGTSTP): `kill -CONT " +
                     std::to_string(victim) + "` resumes it"),
            std::string::npos)
      << out;

  Result e = partrain("explain " + (dir / "out").string(), dir);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("Flight records (2 of 3 ranks)"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("rank 2: no record"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("The others waited for rank 2, which left no record"), std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("#" + std::to_string(std::max(stood_at[0], stood_at[1]))),
            std::string::npos)
      << e.output;
}

TEST(Observe, ExplainRefusesBadInput) {
  auto dir = scratch("observe_explain_bad");
  Result missing = partrain("explain " + (dir / "nope.json").string(), dir);
  EXPECT_EQ(missing.code, 2);
  EXPECT_EQ(std::count(missing.output.begin(), missing.output.end(), '\n'), 1) << missing.output;
  EXPECT_NE(missing.output.find("cannot open the report"), std::string::npos) << missing.output;

  std::ofstream(dir / "bad.json") << "{\"schema\": \"partrain.report/1\", ";
  Result bad = partrain("explain " + (dir / "bad.json").string(), dir);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("not valid JSON"), std::string::npos) << bad.output;

  // A report from before the breakdown existed (checked in with the parity tests) still
  // reads, but has nothing to explain.
  const fs::path old_report =
      fs::path(PARTRAIN_SOURCE_DIR) / "tests/parity/data/report_ddp_cpu.json";
  Result o = partrain("explain " + old_report.string(), dir);
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_EQ(std::count(o.output.begin(), o.output.end(), '\n'), 1) << o.output;
  EXPECT_NE(o.output.find("ranks[0] has no breakdown"), std::string::npos) << o.output;

  // A compute probe splits the compute part of a speed-up, which needs a baseline.
  Result probe_alone =
      partrain("explain " + old_report.string() + " --probe " + old_report.string(), dir);
  EXPECT_EQ(probe_alone.code, 2) << probe_alone.output;
  EXPECT_EQ(std::count(probe_alone.output.begin(), probe_alone.output.end(), '\n'), 1)
      << probe_alone.output;
  EXPECT_NE(probe_alone.output.find("give --baseline too"), std::string::npos)
      << probe_alone.output;
}

}  // namespace
}  // namespace partrain_test
