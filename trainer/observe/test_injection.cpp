#include "trainer/observe/test_injection.h"

#include <array>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <string>
#include <utility>

#if defined(_WIN32)
#include <windows.h>
#endif

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

// PARTRAIN_TEST_SAVE_FAULT's fault for `rank`: none when it is unset or names another rank.
SaveFault save_fault_for(int rank) {
  constexpr const char* kVariable = "PARTRAIN_TEST_SAVE_FAULT";
  constexpr std::array<std::pair<const char*, SaveFault::Phase>, 5> kPhases = {{
      {"before", SaveFault::Phase::kBefore},
      {"write", SaveFault::Phase::kWrite},
      {"rename", SaveFault::Phase::kRename},
      {"manifest", SaveFault::Phase::kManifest},
      {"prune", SaveFault::Phase::kPrune},
  }};
  const char* value = std::getenv(kVariable);
  if (value == nullptr || *value == '\0') return {};
  const std::string text = value;
  const auto first = text.find(':');
  const auto second = first == std::string::npos ? first : text.find(':', first + 1);
  const std::string phase_text =
      first == std::string::npos ? "" : text.substr(first + 1, second - first - 1);
  SaveFault fault;
  bool ok = first != std::string::npos;
  int named = -1;
  try {
    std::size_t end = 0;
    named = std::stoi(text.substr(0, first), &end);
    ok = ok && end == first;
    if (ok && second != std::string::npos) {
      fault.save = std::stoi(text.substr(second + 1), &end);
      ok = end == text.size() - second - 1 && fault.save >= 1;
    }
  } catch (const std::exception&) {
    ok = false;
  }
  for (const auto& [name, phase] : kPhases) {
    if (phase_text == name) fault.phase = phase;
  }
  PARTRAIN_CHECK(ok && fault.phase != SaveFault::Phase::kNone, UsageError, kVariable, "='", text,
                 "': expected RANK:PHASE[:N], PHASE one of before, write, rename, manifest, "
                 "prune, N >= 1 (e.g. 0:rename:2)");
  return named == rank ? fault : SaveFault{};
}

}  // namespace

InjectedFaults injected_faults(int rank) {
  InjectedFaults f;
  f.clock_skew_s = seconds_for("PARTRAIN_TEST_CLOCK_SKEW", rank);
  f.step_delay_s = seconds_for("PARTRAIN_TEST_STEP_DELAY", rank);
  PARTRAIN_CHECK(f.step_delay_s >= 0.0 && f.step_delay_s <= 60.0, UsageError,
                 "PARTRAIN_TEST_STEP_DELAY: the delay must be within 0..60 seconds");
  f.sample_delay_s = seconds_for("PARTRAIN_TEST_SAMPLE_DELAY", rank);
  PARTRAIN_CHECK(f.sample_delay_s >= 0.0 && f.sample_delay_s <= 1.0, UsageError,
                 "PARTRAIN_TEST_SAMPLE_DELAY: the delay must be within 0..1 seconds per sample");
  f.stop_save_delay_s = seconds_for("PARTRAIN_TEST_STOP_SAVE_DELAY", rank);
  PARTRAIN_CHECK(f.stop_save_delay_s >= 0.0 && f.stop_save_delay_s <= 60.0, UsageError,
                 "PARTRAIN_TEST_STOP_SAVE_DELAY: the delay must be within 0..60 seconds");
  f.start_delay_s = seconds_for("PARTRAIN_TEST_START_DELAY", rank);
  PARTRAIN_CHECK(f.start_delay_s >= 0.0 && f.start_delay_s <= 120.0, UsageError,
                 "PARTRAIN_TEST_START_DELAY: the delay must be within 0..120 seconds");
  f.save_fault = save_fault_for(rank);
  f.own_disk = seconds_for("PARTRAIN_TEST_OWN_DISK", rank) > 0;
  return f;
}

void die_at_once() {
#if defined(_WIN32)
  ::TerminateProcess(::GetCurrentProcess(), 9);
#else
  std::raise(SIGKILL);
#endif
  std::_Exit(137);  // not reached: SIGKILL cannot be caught
}

}  // namespace partrain
