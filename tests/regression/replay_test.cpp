// Replays every saved input under tests/regression/<target>/ (crashers the fuzzers found,
// and hand-made hostile inputs) through the fuzz targets' bodies in the normal build.
// An input must be accepted or refused with a UsageError; where INPUT.expect exists, the
// outcome ("accepted", or the UsageError's message) must contain its first line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "fuzz/fuzz_targets.h"

namespace partrain::fuzz {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// Names the target in test listings instead of dumping the struct's bytes.
void PrintTo(const FuzzTarget& target, std::ostream* out) { *out << target.name; }

namespace {

class Replay : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(Replay, EverySavedInputIsAcceptedOrRefusedCleanly) {
  const FuzzTarget target = GetParam();
  const fs::path dir = fs::path(PARTRAIN_SOURCE_DIR) / "tests/regression" / target.name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::vector<fs::path> inputs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() != ".expect") {
      inputs.push_back(entry.path());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  ASSERT_FALSE(inputs.empty()) << "no saved inputs in " << dir;

  for (const auto& input : inputs) {
    const std::string data = read_all(input);
    std::string outcome;
    try {
      target.run(reinterpret_cast<const std::uint8_t*>(data.data()), data.size());
      outcome = "accepted";
    } catch (const UsageError& e) {
      outcome = e.what();
      EXPECT_EQ(outcome.find('\n'), std::string::npos)
          << input.filename() << ": a usage error is one line: " << outcome;
    } catch (const std::exception& e) {
      ADD_FAILURE() << input.filename() << ": neither accepted nor a UsageError: " << e.what();
      continue;
    }
    fs::path expect_path = input;
    expect_path += ".expect";
    if (!fs::exists(expect_path)) continue;
    std::string expected = read_all(expect_path);
    expected = expected.substr(0, expected.find('\n'));
    EXPECT_NE(outcome.find(expected), std::string::npos)
        << input.filename() << ": expected '" << expected << "', got '" << outcome << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(SavedInputs, Replay, ::testing::ValuesIn(kFuzzTargets),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace partrain::fuzz
