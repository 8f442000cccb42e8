// load_reference(): the shipped reference files, derived figures, and errors that name
// file:line:col and the key.
#include "trainer/parity/reference.h"

#include <gtest/gtest.h>

#include "common/errors.h"
#include "tests/parity/synthetic_reports.h"

namespace partrain::parity {
namespace {

using testing::ScratchDir;
using testing::source_dir;

TEST(ReferenceFiles, WindowsGlooFiguresFollowFromTheRawOnes) {
  const Reference ref = load_reference(source_dir() + "/configs/reference/seed_windows_gloo.yaml");
  EXPECT_EQ(ref.name, "windows10-gloo-2x-titanx-pascal");
  EXPECT_EQ(ref.parallel.strategy, "ddp");
  EXPECT_EQ(ref.parallel.devices, 2);
  EXPECT_EQ(*ref.single.num_workers, 0);
  EXPECT_EQ(*ref.parallel.num_workers, 2);
  EXPECT_EQ(*ref.epochs, 10);
  EXPECT_NEAR(*ref.speedup, 174.05 / 123.25, 1e-12);
  ASSERT_EQ(ref.memory_ratio.size(), 2u);
  EXPECT_NEAR(ref.memory_ratio[0], 6939.0 / 8703.0, 1e-12);
  EXPECT_NEAR(ref.memory_ratio[1], 5006.0 / 8703.0, 1e-12);
  EXPECT_NEAR(*ref.balance, 5006.0 / 6939.0, 1e-12);
  EXPECT_EQ(*ref.tolerance.at(kSpeedup).min, 0.85);
  EXPECT_EQ(ref.tolerance.count(kMemoryRatio), 1u);
  EXPECT_EQ(ref.tolerance.count(kBalance), 1u);
}

TEST(ReferenceFiles, LinuxNcclAndDataParallel) {
  const Reference nccl = load_reference(source_dir() + "/configs/reference/seed_linux_nccl.yaml");
  EXPECT_EQ(nccl.backend, "nccl");
  EXPECT_NEAR(*nccl.speedup, 136.43 / 63.33, 1e-12);
  EXPECT_TRUE(nccl.memory_ratio.empty());
  EXPECT_FALSE(nccl.balance);

  const Reference dp = load_reference(source_dir() + "/configs/reference/seed_windows_dp.yaml");
  EXPECT_EQ(dp.parallel.strategy, "dp");
  EXPECT_EQ(*dp.speedup, 1.0);
  EXPECT_FALSE(dp.note.empty());
}

class ReferenceErrors : public ::testing::Test {
 protected:
  // Expects load_reference to fail with a message that starts with "FILE:LINE:COL: " and
  // holds `part`.
  void expect_error(const std::string& text, int line, int column, const std::string& part) {
    const std::string file = dir_.write("ref.yaml", text);
    try {
      load_reference(file);
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const UsageError& e) {
      const std::string message = e.what();
      const std::string where =
          file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
      EXPECT_EQ(message.rfind(where, 0), 0u) << message << "\nexpected it to start with " << where;
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
  ScratchDir dir_;
};

TEST_F(ReferenceErrors, SyntaxError) {
  expect_error("name: x\nparallel: {strategy: ddp, devices: 2\n", 3, 1, "");
}

TEST_F(ReferenceErrors, UnknownKeyIsNamedWhereItIs) {
  expect_error("name: x\nparallel: {strategy: ddp, devices: 2, secnds: 5}\n", 2, 39,
               "parallel.secnds: unknown key");
  expect_error("name: x\nspeedup: 2\n", 2, 1, "speedup: unknown key");
}

TEST_F(ReferenceErrors, WrongTypesAndValues) {
  expect_error("name: x\nparallel: {strategy: ddp, devices: 2, seconds: fast}\n", 2, 48,
               "parallel.seconds: expected a number");
  expect_error("name: x\nparallel: {strategy: ddp, devices: 2, seconds: -3}\n", 2, 48,
               "parallel.seconds: must be positive");
  expect_error("name: x\nparallel: {strategy: ring, devices: 2}\n", 2, 22,
               "parallel.strategy: expected ddp or dp");
  expect_error("name: x\nparallel: {strategy: ddp, devices: 1}\n", 2, 36,
               "parallel.devices: a parallel run needs at least 2 devices");
  expect_error("name: x\nparallel:\n  devices: 2\n  gpu_memory_mb: [1, 2, 3]\n", 4, 18,
               "parallel.gpu_memory_mb: has 3 values for 2 devices");
}

TEST_F(ReferenceErrors, MissingPieces) {
  expect_error("name: x\n", 1, 1, "parallel: missing");
  expect_error("parallel: {devices: 2}\nderived: {speedup: 2}\n", 1, 1, "name: missing");
  expect_error("name: x\nparallel: {devices: 2}\n", 1, 1, "gives no speed-up");
  expect_error("", 1, 1, "expected a mapping");
}

TEST_F(ReferenceErrors, DerivedFigureThatDisagreesWithTheRawOnes) {
  expect_error(
      "name: x\nsingle: {seconds: 100}\nparallel: {devices: 2, seconds: 50}\n"
      "derived: {speedup: 2.5}\n",
      4, 20, "derived.speedup: disagrees with single.seconds / parallel.seconds = 2.0000");
  expect_error(
      "name: x\nsingle: {seconds: 100, gpu_memory_mb: [1000]}\n"
      "parallel: {devices: 2, seconds: 50, gpu_memory_mb: [800, 600]}\n"
      "derived: {memory_ratio: [0.8, 0.7]}\n",
      4, 31, "derived.memory_ratio[1]: disagrees");
}

TEST_F(ReferenceErrors, Tolerances) {
  const std::string base = "name: x\nparallel: {devices: 2}\nderived: {speedup: 2}\n";
  expect_error(base + "tolerance:\n  balance: {min: 0.9}\n", 5, 3,
               "tolerance.balance: the reference has no balance figure");
  expect_error(base + "tolerance:\n  speed: {min: 0.9}\n", 5, 3, "tolerance.speed: unknown key");
  expect_error(base + "tolerance:\n  speedup: {min: 0.9, max: 0.8}\n", 5, 18,
               "tolerance.speedup.min: is above max");
  expect_error(base + "tolerance:\n  speedup: {}\n", 5, 12, "give min, max or both");
  expect_error(base + "tolerance:\n  speedup: {minimum: 1}\n", 5, 13,
               "tolerance.speedup.minimum: unknown key");
}

TEST(ReferenceFileMissing, SaysSo) {
  try {
    load_reference("/nonexistent/ref.yaml");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/ref.yaml: cannot open"), std::string::npos);
  }
}

}  // namespace
}  // namespace partrain::parity
