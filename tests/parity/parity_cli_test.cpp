// `partrain parity` as a user runs it: exit 0 within tolerance, 1 outside, 2 for unreadable
// input or a bad command line; the table on stdout, the files where asked.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/parity/synthetic_reports.h"

namespace partrain::parity {
namespace {

using testing::RunSpec;
using testing::ScratchDir;
using testing::write_run_report;

class ParityCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* exe = std::getenv("PARTRAIN_EXE");
    if (!exe) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
    exe_ = exe;
    ref_ = dir_.write("ref.yaml", testing::kReference);
    single_ = write_run_report(dir_, "single", RunSpec{});
  }

  // Runs `partrain parity ARGS`, keeping stdout and stderr; returns the exit status.
  int parity(const std::string& args) {
    const std::string command = "'" + exe_ + "' parity " + args + " >'" + (dir_ / "stdout") +
                                "' 2>'" + (dir_ / "stderr") + "'";
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string read(const std::string& name) {
    std::ifstream in(dir_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string ddp_report(double epoch_seconds) {
    RunSpec spec = testing::ddp_spec();
    spec.epoch_seconds = {epoch_seconds};
    return write_run_report(dir_, "ddp", spec);
  }

  ScratchDir dir_;
  std::string exe_, ref_, single_;
};

TEST_F(ParityCli, ExitsZeroWithinToleranceAndWritesTheFiles) {
  const std::string md = dir_ / "parity.md", svg = dir_ / "parity.svg";
  EXPECT_EQ(parity(single_ + " " + ddp_report(5.5) + " --reference " + ref_ + " --markdown " + md +
                   " --svg " + svg),
            0)
      << read("stderr");
  const std::string out = read("stdout");
  EXPECT_NE(
      out.find("| Speed-up at equal total batch (single / ddp time) | 1.818 | 2.000 | 0.909 |"),
      std::string::npos)
      << out;
  EXPECT_EQ(read("parity.md"), out);
  EXPECT_EQ(read("parity.svg").rfind("<svg", 0), 0u);
}

TEST_F(ParityCli, ExitsOneOutsideTolerance) {
  EXPECT_EQ(parity(single_ + " " + ddp_report(9.0) + " --reference " + ref_), 1) << read("stderr");
  EXPECT_NE(read("stdout").find("**outside**"), std::string::npos);
}

TEST_F(ParityCli, ExitsTwoForUnreadableInput) {
  const std::string broken = dir_.write("broken.json", "{\"schema\": ");
  EXPECT_EQ(parity(single_ + " " + broken + " --reference " + ref_), 2);
  EXPECT_NE(read("stderr").find(broken + ": not valid JSON at byte offset"), std::string::npos)
      << read("stderr");

  const std::string bad_ref = dir_.write("bad.yaml", "name: x\nparallel: {devices: two}\n");
  EXPECT_EQ(parity(single_ + " " + ddp_report(5.0) + " --reference " + bad_ref), 2);
  EXPECT_NE(read("stderr").find(bad_ref + ":2:21: parallel.devices: expected an integer"),
            std::string::npos)
      << read("stderr");

  EXPECT_EQ(parity(single_ + " --reference " + ref_), 2);  // no parallel run
  EXPECT_NE(read("stderr").find("no ddp run among the reports"), std::string::npos)
      << read("stderr");

  EXPECT_EQ(parity(single_ + " " + ddp_report(5.0)), 2);  // --reference is required
  EXPECT_TRUE(read("stdout").empty());
}

}  // namespace
}  // namespace partrain::parity
