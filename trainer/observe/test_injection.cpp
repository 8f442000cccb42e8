#include "trainer/observe/test_injection.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/errors.h"

namespace partrain {
namespace {

// The seconds that `variable` gives `rank`, 0 when it is unset or names another rank.
double seconds_for(const char* variable, int rank) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return 0.0;
  const std::string text = value;
  const auto colon = text.find(':');
  std::size_t rank_end = 0, seconds_end = 0;
  int named = -1;
  double seconds = 0;
  try {
    named = std::stoi(text.substr(0, colon), &rank_end);
    seconds = std::stod(text.substr(colon + 1), &seconds_end);
  } catch (const std::exception&) {
    rank_end = std::string::npos;
  }
  PARTRAIN_CHECK(colon != std::string::npos && rank_end == colon &&
                     seconds_end == text.size() - colon - 1 && std::isfinite(seconds),
                 UsageError, variable, "='", text, "': expected RANK:SECONDS (e.g. 1:0.05)");
  return named == rank ? seconds : 0.0;
}

}  // namespace

InjectedFaults injected_faults(int rank) {
  InjectedFaults f;
  f.clock_skew_s = seconds_for("PARTRAIN_TEST_CLOCK_SKEW", rank);
  f.step_delay_s = seconds_for("PARTRAIN_TEST_STEP_DELAY", rank);
  PARTRAIN_CHECK(f.step_delay_s >= 0.0 && f.step_delay_s <= 60.0, UsageError,
                 "PARTRAIN_TEST_STEP_DELAY: the delay must be within 0..60 seconds");
  f.stop_save_delay_s = seconds_for("PARTRAIN_TEST_STOP_SAVE_DELAY", rank);
  PARTRAIN_CHECK(f.stop_save_delay_s >= 0.0 && f.stop_save_delay_s <= 60.0, UsageError,
                 "PARTRAIN_TEST_STOP_SAVE_DELAY: the delay must be within 0..60 seconds");
  return f;
}

}  // namespace partrain
