// report.json's format: what write_report() writes, read_run_report() reads back field for
// field; a report written by an earlier build (checked in) still reads, and writing what was
// read gives the same bytes; records from before a field existed read it as 0.
#include "trainer/report/report_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "tests/parity/synthetic_reports.h"
#include "tests/support/usage_error.h"
#include "trainer/report/metrics_log.h"
#include "trainer/report/report_reader.h"
#include "trainer/report/report_writer.h"

namespace partrain {
namespace {

using testing::ScratchDir;
using testing::usage_error_of;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Equal, or both NaN (a diverged run's loss).
void expect_same_number(double a, double b, const std::string& what) {
  if (std::isnan(a) || std::isnan(b)) {
    EXPECT_TRUE(std::isnan(a) && std::isnan(b)) << what << ": " << a << " vs " << b;
  } else {
    EXPECT_EQ(a, b) << what;
  }
}

void expect_same(const RunSummary& a, const RunSummary& b) {
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(a.env.os, b.env.os);
  EXPECT_EQ(a.env.libtorch, b.env.libtorch);
  EXPECT_EQ(a.env.backend, b.env.backend);
  EXPECT_EQ(a.env.world_size, b.env.world_size);
  EXPECT_EQ(a.env.strategy, b.env.strategy);
  EXPECT_EQ(a.env.devices, b.env.devices);
  EXPECT_EQ(a.env.cuda, b.env.cuda);
  ASSERT_EQ(a.epochs.size(), b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    const EpochRecord &x = a.epochs[i], &y = b.epochs[i];
    const std::string at = "epochs[" + std::to_string(i) + "].";
    EXPECT_EQ(x.epoch, y.epoch) << at;
    expect_same_number(x.seconds, y.seconds, at + "seconds");
    expect_same_number(x.train_seconds, y.train_seconds, at + "train_seconds");
    expect_same_number(x.train_images_per_s, y.train_images_per_s, at + "train_images_per_s");
    EXPECT_EQ(x.images, y.images) << at;
    EXPECT_EQ(x.steps, y.steps) << at;
    expect_same_number(x.train_loss, y.train_loss, at + "train_loss");
    expect_same_number(x.test_loss, y.test_loss, at + "test_loss");
    expect_same_number(x.test_accuracy, y.test_accuracy, at + "test_accuracy");
    expect_same_number(x.test_accuracy_top5, y.test_accuracy_top5, at + "test_accuracy_top5");
    EXPECT_EQ(x.skipped_steps, y.skipped_steps) << at;
  }
  EXPECT_EQ(a.total_seconds, b.total_seconds);
  EXPECT_EQ(a.images_per_s, b.images_per_s);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const RankRecord &x = a.ranks[i], &y = b.ranks[i];
    const std::string at = "ranks[" + std::to_string(i) + "]";
    EXPECT_EQ(x.rank, y.rank) << at;
    EXPECT_EQ(x.device, y.device) << at;
    EXPECT_EQ(x.peak_rss_mb, y.peak_rss_mb) << at;
    EXPECT_EQ(x.cuda_peak_allocated_mb, y.cuda_peak_allocated_mb) << at;
    EXPECT_EQ(x.cuda_peak_reserved_mb, y.cuda_peak_reserved_mb) << at;
    EXPECT_EQ(x.cuda_driver_used_mb, y.cuda_driver_used_mb) << at;
    EXPECT_EQ(x.compute_seconds, y.compute_seconds) << at;
    EXPECT_EQ(x.comm_wait_seconds, y.comm_wait_seconds) << at;
    EXPECT_EQ(x.comm_busy_seconds, y.comm_busy_seconds) << at;
    EXPECT_EQ(x.comm_bytes, y.comm_bytes) << at;
    EXPECT_EQ(x.comm_buckets, y.comm_buckets) << at;
    EXPECT_EQ(x.threads, y.threads) << at;
    EXPECT_EQ(x.host_cores, y.host_cores) << at;
    EXPECT_EQ(x.ranks_on_host, y.ranks_on_host) << at;
    ASSERT_EQ(x.breakdown.has_value(), y.breakdown.has_value()) << at;
    if (x.breakdown) {
      for (const auto& [name, part] : kBreakdownParts) {
        EXPECT_EQ((*x.breakdown).*part, (*y.breakdown).*part) << at << ".breakdown." << name;
      }
    }
    ASSERT_EQ(x.memory.has_value(), y.memory.has_value()) << at;
    if (x.memory) {
      for (const auto& [name, part] : kMemoryParts) {
        EXPECT_EQ((*x.memory).*part, (*y.memory).*part) << at << ".memory." << name;
      }
    }
  }
  ASSERT_EQ(a.straggler.has_value(), b.straggler.has_value());
  if (a.straggler) {
    EXPECT_EQ(a.straggler->rank, b.straggler->rank);
    EXPECT_EQ(a.straggler->steps_last, b.straggler->steps_last);
    EXPECT_EQ(a.straggler->steps, b.straggler->steps);
    EXPECT_EQ(a.straggler->seconds_cost, b.straggler->seconds_cost);
    EXPECT_EQ(a.straggler->kind, b.straggler->kind);
    EXPECT_EQ(a.straggler->steps_away, b.straggler->steps_away);
    EXPECT_EQ(a.straggler->median_step_seconds, b.straggler->median_step_seconds);
  }
  ASSERT_EQ(a.compression.has_value(), b.compression.has_value());
  if (a.compression) {
    const CompressionRecord &x = *a.compression, &y = *b.compression;
    EXPECT_EQ(x.method, y.method);
    EXPECT_EQ(x.rank, y.rank);
    EXPECT_EQ(x.start_step, y.start_step);
    EXPECT_EQ(x.compressed_matrices, y.compressed_matrices);
    EXPECT_EQ(x.bytes_per_step, y.bytes_per_step);
    EXPECT_EQ(x.uncompressed_bytes_per_step, y.uncompressed_bytes_per_step);
  }
  ASSERT_EQ(a.balance.has_value(), b.balance.has_value());
  if (a.balance) {
    const BalanceRecord &x = *a.balance, &y = *b.balance;
    EXPECT_EQ(x.mode, y.mode);
    EXPECT_EQ(x.shares, y.shares);
    ASSERT_EQ(x.changes.size(), y.changes.size());
    for (std::size_t i = 0; i < x.changes.size(); ++i) {
      EXPECT_EQ(x.changes[i].step, y.changes[i].step) << i;
      EXPECT_EQ(x.changes[i].shares, y.changes[i].shares) << i;
      EXPECT_EQ(x.changes[i].seconds_per_sample, y.changes[i].seconds_per_sample) << i;
      EXPECT_EQ(x.changes[i].running, y.changes[i].running) << i;
      EXPECT_EQ(x.changes[i].predicted_before, y.changes[i].predicted_before) << i;
      EXPECT_EQ(x.changes[i].predicted_after, y.changes[i].predicted_after) << i;
      EXPECT_EQ(x.changes[i].step_seconds, y.changes[i].step_seconds) << i;
      EXPECT_EQ(x.changes[i].undo, y.changes[i].undo) << i;
      EXPECT_EQ(x.changes[i].before_move_seconds, y.changes[i].before_move_seconds) << i;
    }
  }
  ASSERT_EQ(a.startup.has_value(), b.startup.has_value());
  if (a.startup) {
    EXPECT_EQ(a.startup->join, b.startup->join);
    EXPECT_EQ(a.startup->clocks, b.startup->clocks);
    EXPECT_EQ(a.startup->data, b.startup->data);
    EXPECT_EQ(a.startup->model, b.startup->model);
  }
}

// A run whose every field holds a value of its own (none left at its default), with a loss
// that went NaN, CUDA figures present on one rank and absent on the other.
RunSummary every_field_set(const ScratchDir& dir) {
  testing::RunSpec spec = testing::ddp_spec();
  spec.device = "cuda";
  RunSummary s = testing::run_summary(dir, spec);
  s.env.os = "windows";
  s.env.libtorch = "2.1.0+cu121";
  s.env.cuda = "CUDA 12.1, 2 x NVIDIA TITAN X (Pascal)";
  s.epochs.clear();
  for (int i = 1; i <= 2; ++i) {
    EpochRecord e;
    e.epoch = i;
    e.seconds = 12.25 * i;
    e.train_seconds = 11.5 * i;
    e.train_images_per_s = 4347.826086956522 / i;
    e.images = 50000;
    e.steps = 98 * i;
    e.train_loss = i == 2 ? kNaN : 4.0123456789;
    e.test_loss = 3.75 + i;
    e.test_accuracy = 0.0123 * i;
    e.test_accuracy_top5 = 0.0567 * i;
    e.skipped_steps = 3 * i;
    s.epochs.push_back(e);
  }
  s.total_seconds = 40.5;
  s.images_per_s = 4301.25;
  s.ranks[0].cuda_peak_allocated_mb = 812.5;
  s.ranks[0].cuda_peak_reserved_mb = 1024.0;
  s.ranks[0].cuda_driver_used_mb = 1411.0;
  s.ranks[1].cuda_driver_used_mb = 1399.0;  // the allocator's figures missing on this one
  s.ranks[0].compute_seconds = 30.125;
  s.ranks[1].comm_wait_seconds = 2.5;
  s.ranks[0].comm_busy_seconds = 4.75;
  s.ranks[1].comm_busy_seconds = 5.0625;
  s.ranks[0].comm_bytes = 6'410'000'123;
  s.ranks[1].comm_bytes = 6'410'000'124;
  s.ranks[0].comm_buckets = 40;
  s.ranks[1].comm_buckets = 41;
  s.compression = CompressionRecord{"powersgd", 4, 10, 17, 123456, 4567890};
  for (std::size_t r = 0; r < 2; ++r) {
    Breakdown b;
    double value = 0.125 + static_cast<double>(r);
    for (const auto& [name, part] : kBreakdownParts) b.*part = (value *= 1.5);
    s.ranks[r].breakdown = b;
    MemoryBreakdown m;
    double mb = 160.25 + static_cast<double>(r);
    for (const auto& [name, part] : kMemoryParts) m.*part = (mb *= 0.5);
    m.unexplained = -1.5;  // the parts' peaks need not coincide
    s.ranks[r].memory = m;
  }
  s.straggler = Straggler{1, 180, 196, 3.375, "away", 12, 0.0625};
  s.ranks[0].threads = 2;
  s.ranks[0].host_cores = 16;
  s.ranks[0].ranks_on_host = 2;
  s.ranks[1].threads = 1;
  s.ranks[1].host_cores = 8;
  s.ranks[1].ranks_on_host = 1;
  s.balance =
      BalanceRecord{"auto",
                    {340, 172},
                    {{8, {342, 170}, {0.0012375, 0.00249}, {1.0, 0.5}, 0.6375, 0.4233, 0.66},
                     {14, {256, 256}, {0.0012, 0.0025}, {1.0, 0.5}, 0.4275, 0.64, 0.7, true, 0.66},
                     {96, {340, 172}, {0.00125, 0.0024}, {0.875, 1.0}, 0.43, 0.425}}};
  s.startup = StartupRecord{0.25, 0.0125, 0.5, 0.375};
  return s;
}

TEST(ReportFormat, WhatTheWriterWritesTheReaderReadsBack) {
  ScratchDir dir;
  const RunSummary written = every_field_set(dir);
  write_report(dir / "run", written);
  const std::string path = dir / "run/report.json";
  const RunReport read = read_run_report(path);
  EXPECT_EQ(read.path, path);
  expect_same(written, read.summary);
  EXPECT_EQ(read.strategy, "ddp");
  EXPECT_EQ(read.batch_size, 500);

  // NaN has no JSON spelling: the loss is null in the file, as "final" is when it is NaN.
  const auto doc = nlohmann::json::parse(read_text(path));
  EXPECT_EQ(doc["schema"], std::string(kReportSchema));
  EXPECT_TRUE(doc["epochs"][1]["train_loss"].is_null());
  EXPECT_EQ(doc["final"]["test_loss"], 5.75);
  EXPECT_TRUE(doc["ranks"][1]["cuda_peak_reserved_mb"].is_null());
  EXPECT_EQ(doc["compression"]["method"], "powersgd");
  EXPECT_EQ(doc["compression"]["bytes_per_step"], 123456);
  EXPECT_EQ(doc["compression"]["uncompressed_bytes_per_step"], 4567890);

  // The breakdown's parts, then their total for readers that want only that.
  const auto& b = doc["ranks"][1]["breakdown"];
  EXPECT_EQ(b.size(), kBreakdownParts.size() + 1);
  EXPECT_EQ(b["total"], read.summary.ranks[1].breakdown->total());
  EXPECT_EQ(doc["straggler"]["rank"], 1);

  // Without a straggler the key is there, null.
  RunSummary even = written;
  even.straggler.reset();
  write_report(dir / "even", even);
  EXPECT_TRUE(nlohmann::json::parse(read_text(dir / "even/report.json"))["straggler"].is_null());
  EXPECT_FALSE(read_run_report(dir / "even/report.json").summary.straggler.has_value());
}

// Without compression the report has no "compression" key, and reads back without one.
TEST(ReportFormat, CompressionIsAbsentWithoutIt) {
  ScratchDir dir;
  RunSummary written = every_field_set(dir);
  written.compression.reset();
  write_report(dir / "run", written);
  const std::string path = dir / "run/report.json";
  EXPECT_FALSE(nlohmann::json::parse(read_text(path)).contains("compression"));
  EXPECT_FALSE(read_run_report(path).summary.compression.has_value());
}

TEST(ReportFormat, ABadBreakdownOrStragglerIsNamed) {
  ScratchDir dir;
  RunSummary s = every_field_set(dir);
  auto doc = report_to_json(s);
  doc["ranks"][0]["breakdown"]["forward"] = -1.0;
  const std::string bad = dir.write("bad.json", doc.dump());
  EXPECT_EQ(usage_error_of([&] { read_run_report(bad); }),
            bad + ": ranks[0].breakdown.forward: must not be negative");
  doc = report_to_json(s);
  doc["balance"]["changes"][0]["running"][1] = 1.5;
  const std::string over = dir.write("over.json", doc.dump());
  EXPECT_EQ(usage_error_of([&] { read_run_report(over); }),
            over + ": balance.changes[0].running[1]: is a fraction of the time, at most 1");
  // A report from before the running fractions reads them as 1 (never stopped).
  doc = report_to_json(s);
  doc["balance"]["changes"][0].erase("running");
  // ... and one from before the measured step times as unmeasured (0), no move undone.
  doc["balance"]["changes"][0].erase("step_seconds");
  doc["balance"]["changes"][1].erase("undo");
  doc["balance"]["changes"][1].erase("before_move_seconds");
  const RunReport older = read_run_report(dir.write("older.json", doc.dump()));
  EXPECT_EQ(older.summary.balance->changes[0].running, (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(older.summary.balance->changes[0].step_seconds, 0.0);
  EXPECT_FALSE(older.summary.balance->changes[1].undo);
  doc = report_to_json(s);
  doc["balance"]["changes"][1]["undo"] = "yes";
  const std::string word = dir.write("word.json", doc.dump());
  EXPECT_EQ(usage_error_of([&] { read_run_report(word); }),
            word + ": balance.changes[1].undo: expected true or false, found a string");
  doc = report_to_json(s);
  doc["straggler"]["steps_last"] = 500;
  const std::string worse = dir.write("worse.json", doc.dump());
  EXPECT_EQ(usage_error_of([&] { read_run_report(worse); }),
            worse + ": straggler.steps_last: is more than steps");
}

// tests/parity/data/report_ddp_cpu.json is the report.json of a real 2-rank CPU run
// (asio-ring, 2 epochs). A change of a field's name, type, order or number format shows here.
TEST(ReportFormat, ACheckedInReportReadsAndIsWrittenAgainByteForByte) {
  const std::string fixture = testing::source_dir() + "/tests/parity/data/report_ddp_cpu.json";
  const RunReport read = read_run_report(fixture);
  const RunSummary& s = read.summary;
  EXPECT_EQ(s.env.os, "linux");
  EXPECT_EQ(s.env.backend, "asio-ring");
  EXPECT_EQ(s.env.world_size, 2);
  EXPECT_EQ(s.env.devices, (std::vector<std::string>{"cpu", "cpu"}));
  EXPECT_FALSE(s.env.cuda);
  ASSERT_EQ(s.epochs.size(), 2u);
  EXPECT_EQ(s.epochs[1].epoch, 2);
  EXPECT_EQ(s.epochs[1].steps, 16);
  EXPECT_EQ(s.epochs[1].images, 512);
  EXPECT_EQ(s.epochs[1].test_accuracy, 0.0390625);
  EXPECT_EQ(s.epochs[1].test_accuracy_top5, 0.28125);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[1].peak_rss_mb, 188.078125);
  EXPECT_FALSE(s.ranks[1].cuda_peak_reserved_mb);
  EXPECT_EQ(read.config_leaves.at("comm.backend"), "asio-ring");
  EXPECT_EQ(read.config_leaves.at("data.batch_size"), "32");
  // Written before the breakdown and the straggler existed: neither is there.
  EXPECT_FALSE(s.ranks[0].breakdown.has_value());
  EXPECT_FALSE(s.straggler.has_value());

  // Written again, it is the same text with the one key every report now has.
  ScratchDir dir;
  write_report(dir.string(), s);
  std::string expected = read_text(fixture);
  const std::string before_final = "  ],\n  \"final\": {";
  ASSERT_NE(expected.find(before_final), std::string::npos);
  expected.replace(expected.find(before_final), before_final.size(),
                   "  ],\n  \"straggler\": null,\n  \"final\": {");
  EXPECT_EQ(read_text(dir / "report.json"), expected);
}

TEST(ReportFormat, EpochRecordsFromBeforeTheLaterFieldsReadThemAsZero) {
  nlohmann::json old = nlohmann::json(epoch_to_json(EpochRecord{}));
  old["epoch"] = 4;
  old["test_accuracy"] = 0.5;
  old.erase("test_accuracy_top5");
  old.erase("skipped_steps");
  const EpochRecord e = epoch_from_json(old);
  EXPECT_EQ(e.epoch, 4);
  EXPECT_EQ(e.test_accuracy, 0.5);
  EXPECT_EQ(e.test_accuracy_top5, 0.0);
  EXPECT_EQ(e.skipped_steps, 0);

  old.erase("steps");
  EXPECT_EQ(usage_error_of([&] { epoch_from_json(old); }), "epoch record: steps: missing");
}

// A resumed run keeps metrics.jsonl's lines up to where it resumes; lines that are not its own
// (a "type" that is not text, half a line from a killed run) are dropped, not fatal.
TEST(ReportFormat, AResumedMetricsLogDropsLinesThatAreNotItsOwn) {
  ScratchDir dir;
  std::ofstream(dir / "metrics.jsonl")
      << "{\"type\":\"step\",\"epoch\":1,\"step\":2,\"loss\":1.5}\n"
      << "{\"type\":5,\"epoch\":1,\"step\":3}\n"
      << "{\"type\":\"step\",\"epoch\":1,\"step\":9,\"loss\":1.0}\n"
      << "{\"type\":\"step\",\"epo";
  { MetricsLog resumed(dir.string(), {}, 4); }
  EXPECT_EQ(read_text(dir / "metrics.jsonl"),
            "{\"type\":\"step\",\"epoch\":1,\"step\":2,\"loss\":1.5}\n");
}

}  // namespace
}  // namespace partrain
