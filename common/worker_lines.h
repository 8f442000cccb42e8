// defines: the lines a worker prints that the launcher reads back — format_epoch_line() and
// parse_epoch_line(), format_lost_rank_line() and parse_lost_rank_line() — and
// parse_number_before(), the one number parser both parse with. No LibTorch, no Boost.
//
// A worker writes these lines and `partrain run` reads them from the worker's pipes; keeping
// the writing and the reading side here keeps the two in step.
#pragma once

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

// The decimal number that `text` starts with, when `terminator` follows it: at most 9 digits,
// so that it always fits an int; nullopt for no digits, more digits or another character.
std::optional<int> parse_number_before(std::string_view text, char terminator);

}  // namespace partrain
