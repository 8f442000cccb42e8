#include "common/worker_lines.h"

namespace partrain {
namespace {

constexpr std::string_view kEpochPrefix = "epoch ";
constexpr std::string_view kLostRankPrefix = "partrain: lost rank ";

// What follows `prefix` in `line`, or nullopt when the line does not start with it.
std::optional<std::string_view> after_prefix(std::string_view line, std::string_view prefix) {
  if (line.substr(0, prefix.size()) != prefix) return std::nullopt;
  return line.substr(prefix.size());
}

}  // namespace

std::string format_epoch_line(int epoch, int epochs) {
  return std::string(kEpochPrefix) + std::to_string(epoch) + "/" + std::to_string(epochs);
}

int parse_epoch_line(std::string_view line) {
  const auto rest = after_prefix(line, kEpochPrefix);
  if (!rest) return 0;
  return parse_number_before(*rest, '/').value_or(0);
}

std::string format_lost_rank_line(int rank, std::string_view what) {
  return std::string(kLostRankPrefix) + std::to_string(rank) + ": " + std::string(what);
}

int parse_lost_rank_line(std::string_view line) {
  const auto rest = after_prefix(line, kLostRankPrefix);
  if (!rest) return -1;
  return parse_number_before(*rest, ':').value_or(-1);
}

std::optional<int> parse_number_before(std::string_view text, char terminator) {
  constexpr std::size_t kMaxDigits = 9;  // 999999999 < 2^31
  std::size_t digits = 0;
  int value = 0;
  while (digits < text.size() && digits < kMaxDigits && text[digits] >= '0' &&
         text[digits] <= '9') {
    value = value * 10 + (text[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits >= text.size() || text[digits] != terminator) return std::nullopt;
  return value;
}

}  // namespace partrain
