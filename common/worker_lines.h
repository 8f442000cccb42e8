// defines: the lines a worker prints that the launcher reads back — format_epoch_line() and
// parse_epoch_line(), format_lost_rank_line() and parse_lost_rank_line(), format_rank_stopped()
// and parse_rank_stopped() (of a line, or of an error's message),
// format_stopped_line() and parse_stopped_line(), format_start_up_stop_line() and
// is_start_up_stop_line(), format_flight_line() and parse_flight_line(),
// kHeartbeatLine and is_heartbeat_line() — and parse_number_before() / parse_count_before(), the
// number parsers they share. No LibTorch, no Boost.
//
// A worker writes these lines and `partrain run` reads them from the worker's pipes; keeping
// the writing and the reading side here keeps the two in step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace partrain {

// "epoch E/N": a worker starts epoch E of N. Rank 0's progress and end-of-epoch lines start
// the same way ("epoch E/N step ...") and count as well. The launcher keeps the latest E of
// each rank to say in which epoch a rank failed.
std::string format_epoch_line(int epoch, int epochs);
// E for a line that starts "epoch E/"; 0 for any other line.
int parse_epoch_line(std::string_view line);

// "partrain: lost rank R: WHAT": a worker's last line on stderr when it stops because peer R
// died, closed or timed out, so that the launcher's verdict can name the rank that was lost.
std::string format_lost_rank_line(int rank, std::string_view what);
// R for such a line; -1 for any other line.
int parse_lost_rank_line(std::string_view line);

// WHY for the lines below that carry a rank's error to the others: its first line, at most
// 1000 bytes of it (a LibTorch error goes on with its backtrace).
std::string reason_of(std::string_view error);

// "rank R (HOST) stopped: WHY": what a rank that stopped on an error of its own says through
// the store (comm::RankGroup::tell_stopped()), and what a rank that lost it puts at the end of
// its lost-rank line, after "; ". The launcher's verdict gives it.
std::string format_rank_stopped(int rank, std::string_view host, std::string_view why);
struct RankStopped {
  std::string host;
  std::string why;
};
// The host and reason of rank R's "; rank R (HOST) stopped: WHY" in a lost-rank line for R;
// nullopt where the line has none.
std::optional<RankStopped> parse_rank_stopped(std::string_view line);
// The same in the message of an error that lost rank `rank` (what a lost-rank line carries).
std::optional<RankStopped> parse_rank_stopped(std::string_view message, int rank);

// "partrain: at failure, WHERE [PATH]": a failing worker's flight record (where it stood among
// its collectives, trainer/observe/flight_recorder.h) and the file it dumped it to. The
// launcher's verdict says where each rank stood.
std::string format_flight_line(std::string_view where, std::string_view path);
// WHERE for such a line; empty for any other line.
std::string parse_flight_line(std::string_view line);

// "partrain: stopped at step N by SIGNAL": a worker's last line on stderr when it stopped at
// a stop signal after saving step N (it then exits with kExitStopped, common/stop_request.h).
// The launcher's verdict names the step.
std::string format_stopped_line(std::int64_t step, std::string_view signal);
// N for such a line; -1 for any other line.
std::int64_t parse_stopped_line(std::string_view line);

// "partrain: stopped during start-up by SIGNAL; run the same command to continue": a worker's
// last line when a stop signal came before its first step (StopRequest, common/stop_request.h)
// and it exited with kExitStopped, having nothing to save. The launcher's verdict says so.
std::string format_start_up_stop_line(std::string_view signal);
bool is_start_up_stop_line(std::string_view line);
// How such a rank's reason ends, where it tells the others why it leaves them ("SIGTERM before
// its first step", format_rank_stopped()): a rank that loses it takes that as the same stop.
inline constexpr std::string_view kStartUpStopWhy = " before its first step";

// What a worker started by `partrain run` prints on stderr every PARTRAIN_HEARTBEAT_S seconds
// (from a thread of its own) so that the launcher can tell a frozen worker (SIGSTOP, a host
// that stopped scheduling it) from a busy one. The launcher swallows these lines.
inline constexpr std::string_view kHeartbeatLine = "partrain: heartbeat";
bool is_heartbeat_line(std::string_view line);

// The decimal number that `text` starts with, when `terminator` follows it: at most 9 digits,
// so that it always fits an int; nullopt for no digits, more digits or another character.
std::optional<int> parse_number_before(std::string_view text, char terminator);
// The same for counts up to 18 digits (steps), which always fit an int64.
std::optional<std::int64_t> parse_count_before(std::string_view text, char terminator);

}  // namespace partrain
