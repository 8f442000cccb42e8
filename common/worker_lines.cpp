#include "common/worker_lines.h"

namespace partrain {
namespace {

constexpr std::string_view kEpochPrefix = "epoch ";
constexpr std::string_view kLostRankPrefix = "partrain: lost rank ";
constexpr std::string_view kStoppedPrefix = "partrain: stopped at step ";
constexpr std::string_view kStartUpStopPrefix = "partrain: stopped during start-up by ";
constexpr std::string_view kStartUpStopEnd = "; run the same command to continue";
constexpr std::string_view kFlightPrefix = "partrain: at failure, ";

// The decimal number of at most `max_digits` digits that `text` starts with, when
// `terminator` follows it.
std::optional<std::int64_t> parse_digits_before(std::string_view text, char terminator,
                                                std::size_t max_digits) {
  std::size_t digits = 0;
  std::int64_t value = 0;
  while (digits < text.size() && digits < max_digits && text[digits] >= '0' &&
         text[digits] <= '9') {
    value = value * 10 + (text[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits >= text.size() || text[digits] != terminator) return std::nullopt;
  return value;
}

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

std::string reason_of(std::string_view error) {
  constexpr std::size_t kLongest = 1000;
  return std::string(error.substr(0, std::min(error.find('\n'), kLongest)));
}

std::string format_rank_stopped(int rank, std::string_view host, std::string_view why) {
  return "rank " + std::to_string(rank) + " (" + std::string(host) +
         ") stopped: " + std::string(why);
}

std::optional<RankStopped> parse_rank_stopped(std::string_view line) {
  const int rank = parse_lost_rank_line(line);
  if (rank < 0) return std::nullopt;
  return parse_rank_stopped(line, rank);
}

std::optional<RankStopped> parse_rank_stopped(std::string_view message, int rank) {
  const std::string opening = "; rank " + std::to_string(rank) + " (";
  const std::size_t at = message.find(opening);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view rest = message.substr(at + opening.size());
  constexpr std::string_view kStopped = ") stopped: ";
  const std::size_t end = rest.find(kStopped);
  if (end == std::string_view::npos) return std::nullopt;
  return RankStopped{std::string(rest.substr(0, end)),
                     std::string(rest.substr(end + kStopped.size()))};
}

std::string format_flight_line(std::string_view where, std::string_view path) {
  return std::string(kFlightPrefix) + std::string(where) + " [" + std::string(path) + "]";
}

std::string parse_flight_line(std::string_view line) {
  const auto rest = after_prefix(line, kFlightPrefix);
  if (!rest) return "";
  const auto bracket = rest->rfind(" [");
  if (bracket == std::string_view::npos || rest->back() != ']') return "";
  return std::string(rest->substr(0, bracket));
}

std::string format_stopped_line(std::int64_t step, std::string_view signal) {
  return std::string(kStoppedPrefix) + std::to_string(step) + " by " + std::string(signal);
}

std::int64_t parse_stopped_line(std::string_view line) {
  const auto rest = after_prefix(line, kStoppedPrefix);
  if (!rest) return -1;
  return parse_count_before(*rest, ' ').value_or(-1);
}

std::string format_start_up_stop_line(std::string_view signal) {
  return std::string(kStartUpStopPrefix) + std::string(signal) + std::string(kStartUpStopEnd);
}

bool is_start_up_stop_line(std::string_view line) {
  return line.starts_with(kStartUpStopPrefix) && line.ends_with(kStartUpStopEnd);
}

bool is_heartbeat_line(std::string_view line) { return line == kHeartbeatLine; }

std::optional<int> parse_number_before(std::string_view text, char terminator) {
  constexpr std::size_t kMaxDigits = 9;  // 999999999 < 2^31
  const auto value = parse_digits_before(text, terminator, kMaxDigits);
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

std::optional<std::int64_t> parse_count_before(std::string_view text, char terminator) {
  constexpr std::size_t kMaxDigits = 18;  // < 2^63
  return parse_digits_before(text, terminator, kMaxDigits);
}

}  // namespace partrain
