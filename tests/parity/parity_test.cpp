// compare() on synthetic reports with known ratios: inside, outside and exactly at the edges
// of the tolerance; the warnings; the memory source; DataParallel runs; Markdown and SVG.
#include "trainer/parity/parity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "common/errors.h"
#include "tests/parity/synthetic_reports.h"

namespace partrain::parity {
namespace {

using testing::RunSpec;
using testing::ScratchDir;
using testing::write_run_report;

const Figure& figure(const ParityResult& result, const std::string& label_start) {
  for (const auto& f : result.figures) {
    if (f.label.rfind(label_start, 0) == 0) return f;
  }
  throw std::runtime_error("no figure " + label_start);
}

bool has_figure(const ParityResult& result, const std::string& label_start) {
  return std::any_of(result.figures.begin(), result.figures.end(),
                     [&](const Figure& f) { return f.label.rfind(label_start, 0) == 0; });
}

bool warned(const ParityResult& result, const std::string& part) {
  return std::any_of(result.warnings.begin(), result.warnings.end(),
                     [&](const std::string& w) { return w.find(part) != std::string::npos; });
}

class ParityTest : public ::testing::Test {
 protected:
  ParityResult run(const RunSpec& single, const RunSpec& parallel,
                   const std::string& reference = testing::kReference) {
    return compare(
        {write_run_report(dir_, "single", single), write_run_report(dir_, "ddp", parallel)},
        dir_.write("ref.yaml", reference));
  }
  static RunSpec ddp(std::vector<double> seconds, std::vector<double> rss = {400.0, 380.0}) {
    RunSpec spec = testing::ddp_spec();
    spec.epoch_seconds = std::move(seconds);
    spec.rss_mb = std::move(rss);
    spec.images_per_s = 9000.0;
    return spec;
  }
  ScratchDir dir_;
};

TEST_F(ParityTest, KnownRatiosWithinTolerance) {
  const ParityResult r = run(RunSpec{}, ddp({5.5, 5.5}));
  const Figure& speedup = figure(r, "Speed-up");
  EXPECT_EQ(speedup.id, kSpeedup);
  EXPECT_NEAR(*speedup.ours, 10.0 / 5.5, 1e-12);
  EXPECT_NEAR(*speedup.reference, 2.0, 1e-12);
  EXPECT_NEAR(*speedup.ratio, 10.0 / 5.5 / 2.0, 1e-12);
  EXPECT_EQ(speedup.verdict, Verdict::kWithin);

  EXPECT_NEAR(*figure(r, "Epoch time, single").ours, 10.0, 1e-12);
  EXPECT_NEAR(*figure(r, "Epoch time, single").reference, 10.0, 1e-12);  // 100 s / 10 epochs
  EXPECT_NEAR(*figure(r, "Epoch time, ddp").reference, 5.0, 1e-12);
  EXPECT_NEAR(*figure(r, "Throughput per device, single").ours, 5000.0, 1e-9);
  EXPECT_NEAR(*figure(r, "Throughput per device, single").reference, 5000.0, 1e-9);
  EXPECT_NEAR(*figure(r, "Throughput per device, ddp").ours, 4500.0, 1e-9);
  EXPECT_NEAR(*figure(r, "Throughput per device, ddp").reference, 5000.0, 1e-9);
  const Figure& efficiency = figure(r, "Scaling efficiency");
  EXPECT_NEAR(*efficiency.ours, 0.9, 1e-12);
  EXPECT_NEAR(*efficiency.reference, 1.0, 1e-12);
  EXPECT_EQ(efficiency.verdict, Verdict::kInfo);  // no tolerance.efficiency in the file

  EXPECT_NEAR(*figure(r, "Memory, ddp device 0").ours, 0.8, 1e-12);
  EXPECT_NEAR(*figure(r, "Memory, ddp device 0").reference, 0.8, 1e-12);
  EXPECT_NEAR(*figure(r, "Memory, ddp device 1").ours, 0.76, 1e-12);
  EXPECT_NEAR(*figure(r, "Memory, ddp device 1").reference, 0.6, 1e-12);
  const Figure& largest = figure(r, "Memory, largest");
  EXPECT_NEAR(*largest.ratio, 1.0, 1e-12);
  EXPECT_EQ(largest.verdict, Verdict::kWithin);
  const Figure& balance = figure(r, "Balance");
  EXPECT_NEAR(*balance.ours, 0.95, 1e-12);
  EXPECT_NEAR(*balance.reference, 0.75, 1e-12);
  EXPECT_EQ(balance.verdict, Verdict::kWithin);

  EXPECT_EQ(r.parallel.total_batch, 1000);
  EXPECT_EQ(r.parallel.memory_source, "peak_rss_mb");
  EXPECT_EQ(exit_code(r), 0);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
}

TEST_F(ParityTest, SlowParallelRunIsOutside) {
  const ParityResult r = run(RunSpec{}, ddp({8.0, 8.0}));
  EXPECT_NEAR(*figure(r, "Speed-up").ratio, 1.25 / 2.0, 1e-12);
  EXPECT_EQ(figure(r, "Speed-up").verdict, Verdict::kOutside);
  EXPECT_EQ(figure(r, "Balance").verdict, Verdict::kWithin);
  EXPECT_EQ(exit_code(r), 1);
}

TEST_F(ParityTest, UnbalancedMemoryIsOutside) {
  const ParityResult r = run(RunSpec{}, ddp({5.0, 5.0}, {450.0, 300.0}));
  EXPECT_EQ(figure(r, "Speed-up").verdict, Verdict::kWithin);
  // largest 0.9 vs 0.8: 1.125 <= 1.25; balance 0.667 vs 0.75: 0.889 < 0.95
  EXPECT_EQ(figure(r, "Memory, largest").verdict, Verdict::kWithin);
  EXPECT_NEAR(*figure(r, "Balance").ratio, (300.0 / 450.0) / 0.75, 1e-12);
  EXPECT_EQ(figure(r, "Balance").verdict, Verdict::kOutside);
  EXPECT_EQ(exit_code(r), 1);
}

// Stated (derived-only) reference figures whose band edges land exactly on our ratios.
constexpr const char* kEdgeReference = R"(name: edge
parallel: {strategy: ddp, devices: 2}
derived: {speedup: 1.5, memory_ratio: [0.8, 0.8]}
tolerance:
  speedup: {min: 0.8}
  memory_ratio: {max: 1.25}
)";

TEST_F(ParityTest, RatioExactlyAtTheEdgeIsWithin) {
  RunSpec single;
  single.epoch_seconds = {30.0};
  // speed-up 30 / 25 = 1.2 = 0.8 x 1.5; largest memory 500 / 500 = 1.0 = 1.25 x 0.8
  const ParityResult r = run(single, ddp({25.0}, {500.0, 500.0}), kEdgeReference);
  EXPECT_NEAR(*figure(r, "Speed-up").ratio, 0.8, 1e-12);
  EXPECT_EQ(figure(r, "Speed-up").verdict, Verdict::kWithin);
  EXPECT_NEAR(*figure(r, "Memory, largest").ratio, 1.25, 1e-12);
  EXPECT_EQ(figure(r, "Memory, largest").verdict, Verdict::kWithin);
  EXPECT_NEAR(*figure(r, "Balance").reference, 1.0, 1e-12);  // from the stated ratios
  EXPECT_EQ(exit_code(r), 0);
}

TEST_F(ParityTest, RatioJustPastTheEdgeIsOutside) {
  RunSpec single;
  single.epoch_seconds = {30.0};
  const ParityResult slow = run(single, ddp({25.01}, {500.0, 500.0}), kEdgeReference);
  EXPECT_EQ(figure(slow, "Speed-up").verdict, Verdict::kOutside);
  EXPECT_EQ(figure(slow, "Memory, largest").verdict, Verdict::kWithin);
  EXPECT_EQ(exit_code(slow), 1);

  const ParityResult heavy = run(single, ddp({25.0}, {500.5, 500.0}), kEdgeReference);
  EXPECT_EQ(figure(heavy, "Speed-up").verdict, Verdict::kWithin);
  EXPECT_EQ(figure(heavy, "Memory, largest").verdict, Verdict::kOutside);
  EXPECT_EQ(exit_code(heavy), 1);
}

TEST_F(ParityTest, TwoSidedBand) {
  const std::string reference = R"(name: band
parallel: {strategy: ddp, devices: 2}
derived: {speedup: 2.0}
tolerance:
  speedup: {min: 0.9, max: 1.0}
)";
  EXPECT_EQ(exit_code(run(RunSpec{}, ddp({5.0}), reference)), 0);     // ratio 1.0
  EXPECT_EQ(exit_code(run(RunSpec{}, ddp({4.9}), reference)), 1);     // ratio 1.02
  EXPECT_EQ(exit_code(run(RunSpec{}, ddp({5.5555}), reference)), 0);  // ratio 0.90001
  EXPECT_EQ(exit_code(run(RunSpec{}, ddp({5.6}), reference)), 1);     // ratio 0.893
}

TEST_F(ParityTest, EfficiencyTolerance) {
  std::string reference = testing::kReference;
  reference += "  efficiency: {min: 0.95}\n";
  // per device 9000 / 2 = 4500 img/s vs 5000 single: 0.9, against the reference's 2 / 2 = 1.0
  const ParityResult r = run(RunSpec{}, ddp({5.5, 5.5}), reference);
  const Figure& f = figure(r, "Scaling efficiency");
  EXPECT_EQ(f.id, kEfficiency);
  EXPECT_NEAR(*f.ratio, 0.9, 1e-12);
  EXPECT_EQ(f.verdict, Verdict::kOutside);
  EXPECT_EQ(exit_code(r), 1);
}

TEST_F(ParityTest, WarnsWhenTheRunsDifferBesidesParallelism) {
  RunSpec single;
  RunSpec parallel = ddp({5.0, 5.0});
  parallel.num_workers = 2;
  parallel.batch_size = 400;                 // total 800 vs 1000
  parallel.epoch_seconds = {5.0, 5.0, 5.0};  // three epochs run vs two
  std::string reference = testing::kReference;
  reference.replace(reference.find("batch_size_per_rank: 500, num_workers: 0"),
                    std::string("batch_size_per_rank: 500, num_workers: 0").size(),
                    "batch_size_per_rank: 500, num_workers: 2");
  const ParityResult r = run(single, parallel, reference);
  EXPECT_TRUE(warned(r, "data.num_workers is 0 (single) vs 2 (ddp)"));
  EXPECT_TRUE(warned(r, "the reference pair differed here too (0 vs 2)"));
  EXPECT_TRUE(warned(r, "total batch differs: 1000 (single) vs 800"));
  EXPECT_TRUE(warned(r, "different numbers of epochs: 2 (single) vs 3"));
  // per-rank batch size and the launch/comm sections differ by design
  EXPECT_FALSE(warned(r, "data.batch_size is"));
  EXPECT_FALSE(warned(r, "launch."));
  EXPECT_FALSE(warned(r, "strategy is"));
}

TEST_F(ParityTest, WarnsWhenEpochsOrDatasetDifferFromTheReference) {
  RunSpec single;
  single.epochs = 3;
  single.dataset = "synthetic";
  RunSpec parallel = ddp({5.0, 5.0});
  parallel.epochs = 3;
  parallel.dataset = "synthetic";
  parallel.world_size = 4;
  parallel.batch_size = 250;
  parallel.rss_mb = {400.0, 400.0, 400.0, 400.0};
  const ParityResult r = run(single, parallel);
  EXPECT_TRUE(warned(r, "the runs train 3 epochs, the reference 10"));
  EXPECT_TRUE(warned(r, "dataset synthetic, the reference cifar100"));
  EXPECT_TRUE(warned(r, "uses 4 devices, the reference 2"));
  EXPECT_FALSE(warned(r, "total batch"));
  EXPECT_EQ(r.parallel.total_batch, 1000);
  EXPECT_NEAR(*figure(r, "Throughput per device, ddp").ours, 9000.0 / 4, 1e-9);
}

TEST_F(ParityTest, ConfigDifferencesBeyondTheKnownKeysAreWarned) {
  nlohmann::json single = testing::report_json(dir_, RunSpec{});
  nlohmann::json parallel = testing::report_json(dir_, ddp({5.0}));
  parallel["config"]["train"]["optimizer"]["lr"] = 0.1;
  parallel["config"]["seed"] = 7;
  const ParityResult r =
      compare({dir_.write("s.json", single.dump()), dir_.write("p.json", parallel.dump())},
              dir_.write("ref.yaml", testing::kReference));
  EXPECT_TRUE(warned(r, "train.optimizer.lr is 0.05 (single) vs 0.1 (ddp)"));
  EXPECT_TRUE(warned(r, "seed is 0 (single) vs 7 (ddp)"));
}

TEST_F(ParityTest, CudaMemoryPrefersReservedThenAllocated) {
  RunSpec single;
  single.device = "cuda";
  single.cuda_allocated_mb = std::vector<double>{900.0};
  single.cuda_reserved_mb = std::vector<double>{1000.0};
  RunSpec parallel = ddp({5.0});
  parallel.device = "cuda";
  parallel.cuda_allocated_mb = std::vector<double>{400.0, 400.0};
  parallel.cuda_reserved_mb = std::vector<double>{700.0, 600.0};
  ParityResult r = run(single, parallel);
  EXPECT_EQ(r.single.memory_source, "cuda_peak_reserved_mb");
  EXPECT_NEAR(*figure(r, "Memory, ddp device 0").ours, 0.7, 1e-12);
  EXPECT_NEAR(*figure(r, "Balance").ours, 600.0 / 700.0, 1e-12);

  parallel.cuda_reserved_mb.reset();  // reserved missing in one run: both fall back
  r = run(single, parallel);
  EXPECT_EQ(r.parallel.memory_source, "cuda_peak_allocated_mb");
  EXPECT_NEAR(*figure(r, "Memory, ddp device 0").ours, 400.0 / 900.0, 1e-12);
}

TEST_F(ParityTest, DataParallelBesideDdpIsShownWithoutReference) {
  RunSpec dp;
  dp.strategy = "dp";
  dp.epoch_seconds = {12.5, 12.5};
  const ParityResult r =
      compare({write_run_report(dir_, "s", RunSpec{}), write_run_report(dir_, "p", ddp({5.0})),
               write_run_report(dir_, "dp", dp)},
              dir_.write("ref.yaml", testing::kReference));
  ASSERT_TRUE(r.extra);
  EXPECT_EQ(r.extra->role, "dp");
  EXPECT_EQ(r.extra->devices, 2);
  const Figure& f = figure(r, "Speed-up of dp");
  EXPECT_NEAR(*f.ours, 0.8, 1e-12);
  EXPECT_FALSE(f.reference);
  EXPECT_EQ(f.verdict, Verdict::kInfo);
}

TEST_F(ParityTest, DataParallelReference) {
  const std::string reference = R"(name: dp-reference
parallel: {strategy: dp, devices: 2}
derived: {speedup: 1.0}
tolerance: {speedup: {min: 0.9}}
)";
  RunSpec dp;
  dp.strategy = "dp";
  dp.epoch_seconds = {10.5};
  const ParityResult r = run(RunSpec{}, dp, reference);
  EXPECT_EQ(r.parallel.role, "dp");
  EXPECT_NEAR(*figure(r, "Speed-up").ours, 10.0 / 10.5, 1e-12);
  EXPECT_EQ(figure(r, "Speed-up").verdict, Verdict::kWithin);
  EXPECT_TRUE(has_figure(r, "Memory, dp process"));  // one process drives both devices
  EXPECT_FALSE(has_figure(r, "Balance"));
  // a ddp report is not what this reference compares
  EXPECT_THROW(run(RunSpec{}, ddp({5.0}), reference), UsageError);
}

TEST_F(ParityTest, ReportSetsThatCannotBeCompared) {
  const std::string ref = dir_.write("ref.yaml", testing::kReference);
  const std::string single = write_run_report(dir_, "s", RunSpec{});
  const std::string single2 = write_run_report(dir_, "s2", RunSpec{});
  const std::string parallel = write_run_report(dir_, "p", ddp({5.0}));
  try {
    compare({single}, ref);
    FAIL() << "a single report alone was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no ddp run among the reports"), std::string::npos)
        << e.what();
  }
  try {
    compare({parallel}, ref);
    FAIL() << "a parallel report alone was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no single-device run"), std::string::npos) << e.what();
  }
  try {
    compare({single, parallel, single2}, ref);
    FAIL() << "two single reports were accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a second single run"), std::string::npos) << e.what();
  }
  RunSpec one_rank_ddp = ddp({5.0}, {400.0});
  one_rank_ddp.world_size = 1;
  EXPECT_THROW(compare({single, write_run_report(dir_, "p1", one_rank_ddp)}, ref), UsageError);
}

TEST_F(ParityTest, MarkdownShowsEveryFigureAndTheVerdict) {
  RunSpec parallel = ddp({8.0, 8.0});
  parallel.num_workers = 2;
  const std::string md = to_markdown(run(RunSpec{}, parallel));
  EXPECT_NE(md.find("## Parity against test-reference"), std::string::npos);
  EXPECT_NE(md.find("| Speed-up at equal total batch (single / ddp time) | 1.250 | 2.000 | 0.625 | "
                    "≥ 0.850 | **outside** |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| Balance across devices (min / max memory) | 0.950 | 0.750 | 1.267 | ≥ 0.950 "
                    "| within |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| Epoch time, single (s) | 10.00 | 10.00 | 1.000 | — | — |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("**Result: 1 of 3 checked figures outside tolerance: Speed-up"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("### Warnings"), std::string::npos);
  EXPECT_NE(md.find("data.num_workers"), std::string::npos);
}

TEST_F(ParityTest, SvgHoldsBothPanelsWithValues) {
  std::string reference = testing::kReference;
  reference.replace(reference.find("test-reference"), 14, "a<b & c");
  const std::string svg = to_svg(run(RunSpec{}, ddp({5.5, 5.5}), reference));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("Epoch time relative to the single run"), std::string::npos);
  EXPECT_NE(svg.find("Memory per device relative to the single run"), std::string::npos);
  EXPECT_NE(svg.find("a&lt;b &amp; c"), std::string::npos);  // escaped
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find(">0.55<"), std::string::npos);  // our ddp epoch time, 5.5 / 10
  EXPECT_NE(svg.find(">0.50<"), std::string::npos);  // the reference's, 1 / 2
  EXPECT_NE(svg.find(">0.76<"), std::string::npos);  // our device 1 memory
  EXPECT_NE(svg.find(">0.60<"), std::string::npos);  // the reference's
  EXPECT_NE(svg.find("all 3 checked figures within tolerance"), std::string::npos);
  // every opened element is closed
  std::size_t opened = 0, closed = 0;
  for (std::size_t p = svg.find("<text"); p != std::string::npos; p = svg.find("<text", p + 1))
    ++opened;
  for (std::size_t p = svg.find("</text>"); p != std::string::npos; p = svg.find("</text>", p + 1))
    ++closed;
  EXPECT_EQ(opened, closed);
}

TEST_F(ParityTest, OutputsAreWrittenWhole) {
  const ParityResult r = run(RunSpec{}, ddp({5.5}));
  const std::string md = dir_ / "out.md", svg = dir_ / "out.svg";
  write_parity_outputs(r, md, svg);
  std::ifstream md_in(md), svg_in(svg);
  std::stringstream md_text, svg_text;
  md_text << md_in.rdbuf();
  svg_text << svg_in.rdbuf();
  EXPECT_EQ(md_text.str(), to_markdown(r));
  EXPECT_EQ(svg_text.str(), to_svg(r));
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_THROW(write_parity_outputs(r, dir_ / "no/such/dir/out.md", ""), UsageError);
}

}  // namespace
}  // namespace partrain::parity
