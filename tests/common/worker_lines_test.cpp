// The worker -> launcher lines: what format_*_line() writes, parse_*_line() reads back, the
// exact text of each (the launcher of an older or newer build reads the same lines), and the
// lines that only look like them.
#include "common/worker_lines.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace partrain {
namespace {

TEST(WorkerLines, EpochLineTextAndRoundTrip) {
  EXPECT_EQ(format_epoch_line(3, 10), "epoch 3/10");
  for (const int epoch : {1, 2, 9, 10, 99, 12345, 999999999}) {
    EXPECT_EQ(parse_epoch_line(format_epoch_line(epoch, 999999999)), epoch) << epoch;
    // Rank 0's progress and end-of-epoch lines carry the epoch the same way.
    EXPECT_EQ(parse_epoch_line(format_epoch_line(epoch, 7) + " step 3/8 loss 2.3 100 img/s"),
              epoch);
  }
}

TEST(WorkerLines, LostRankLineTextAndRoundTrip) {
  EXPECT_EQ(format_lost_rank_line(3, "ring: rank 3 timed out"),
            "partrain: lost rank 3: ring: rank 3 timed out");
  for (const int rank : {0, 1, 7, 10, 4095, 999999999}) {
    EXPECT_EQ(parse_lost_rank_line(format_lost_rank_line(rank, "peer closed")), rank) << rank;
    EXPECT_EQ(parse_lost_rank_line(format_lost_rank_line(rank, "")), rank) << rank;
  }
}

TEST(WorkerLines, MalformedEpochLinesAreNotEpochLines) {
  EXPECT_EQ(parse_epoch_line(""), 0);
  EXPECT_EQ(parse_epoch_line("epoch "), 0);
  EXPECT_EQ(parse_epoch_line("epoch 3"), 0);       // no "/N"
  EXPECT_EQ(parse_epoch_line("epoch 3 of 4"), 0);  // another separator
  EXPECT_EQ(parse_epoch_line("epoch -3/4"), 0);    // no sign
  EXPECT_EQ(parse_epoch_line("epoch +3/4"), 0);
  EXPECT_EQ(parse_epoch_line("epoch 3 /4"), 0);
  EXPECT_EQ(parse_epoch_line("Epoch 3/4"), 0);           // case matters
  EXPECT_EQ(parse_epoch_line("[rank 1] epoch 3/4"), 0);  // a relayed line, not the worker's
  EXPECT_EQ(parse_epoch_line("epoch 1000000000/4"), 0);  // ten digits: more than an int holds
  EXPECT_EQ(parse_epoch_line(std::string_view("epoch 3\0/4", 10)), 0);
}

TEST(WorkerLines, MalformedLostRankLinesAreNotLostRankLines) {
  EXPECT_EQ(parse_lost_rank_line(""), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank "), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank x: y"), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank -1: y"), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank 2 : y"), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank 2; y"), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain:  lost rank 2: y"), -1);
  EXPECT_EQ(parse_lost_rank_line("partrain: lost rank 1000000000: y"), -1);
  // The epoch line is not a lost-rank line and the other way round.
  EXPECT_EQ(parse_lost_rank_line(format_epoch_line(2, 3)), -1);
  EXPECT_EQ(parse_epoch_line(format_lost_rank_line(2, "x")), 0);
}

TEST(WorkerLines, NumberBeforeATerminator) {
  EXPECT_EQ(parse_number_before("0/", '/'), 0);
  EXPECT_EQ(parse_number_before("007:", ':'), 7);
  EXPECT_EQ(parse_number_before("123456789/rest", '/'), 123456789);
  EXPECT_EQ(parse_number_before("999999999/", '/'), 999999999);
  EXPECT_LE(999999999, std::numeric_limits<int>::max());
  EXPECT_EQ(parse_number_before("1234567890/", '/'), std::nullopt);  // ten digits
  EXPECT_EQ(parse_number_before("12", '/'), std::nullopt);           // no terminator
  EXPECT_EQ(parse_number_before("12:", '/'), std::nullopt);          // another one
  EXPECT_EQ(parse_number_before("/", '/'), std::nullopt);            // no digits
  EXPECT_EQ(parse_number_before("", '/'), std::nullopt);
  EXPECT_EQ(parse_number_before(" 1/", '/'), std::nullopt);
}

TEST(WorkerLines, StoppedLineTextAndRoundTrip) {
  EXPECT_EQ(format_stopped_line(123, "SIGTERM"), "partrain: stopped at step 123 by SIGTERM");
  for (const std::int64_t step : {std::int64_t{0}, std::int64_t{1}, std::int64_t{999999999},
                                  std::int64_t{1} << 40, std::int64_t{999999999999999999}}) {
    EXPECT_EQ(parse_stopped_line(format_stopped_line(step, "SIGUSR1")), step) << step;
    EXPECT_EQ(parse_stopped_line(format_stopped_line(step, "a stop request from rank 3")), step);
  }
  EXPECT_EQ(parse_stopped_line("partrain: stopped at step 12"), -1);  // no " by"
  EXPECT_EQ(parse_stopped_line("partrain: stopped at step x by SIGTERM"), -1);
  EXPECT_EQ(parse_stopped_line("partrain: stopped at step 1000000000000000000 by SIGTERM"), -1);
  EXPECT_EQ(parse_stopped_line(format_lost_rank_line(2, "x")), -1);
  EXPECT_EQ(parse_lost_rank_line(format_stopped_line(2, "SIGTERM")), -1);
  EXPECT_EQ(parse_epoch_line(format_stopped_line(2, "SIGTERM")), 0);
}

TEST(WorkerLines, StartUpStopLineIsToldFromTheOthers) {
  const std::string line = format_start_up_stop_line("SIGINT");
  EXPECT_EQ(line, "partrain: stopped during start-up by SIGINT; run the same command to continue");
  EXPECT_TRUE(is_start_up_stop_line(line));
  EXPECT_EQ(parse_stopped_line(line), -1);  // no step was saved
  EXPECT_FALSE(is_start_up_stop_line(format_stopped_line(3, "SIGINT")));
  EXPECT_FALSE(is_start_up_stop_line("partrain: stopped during start-up by SIGINT"));
  EXPECT_EQ(parse_lost_rank_line(line), -1);
}

TEST(WorkerLines, FlightLineTextAndRoundTrip) {
  const std::string where = "in allreduce #136 (step 68, bucket 2, 1.1 MB) for 5.0 s";
  const std::string line = format_flight_line(where, "out/flight/rank-1.json");
  EXPECT_EQ(line, "partrain: at failure, " + where + " [out/flight/rank-1.json]");
  EXPECT_EQ(parse_flight_line(line), where);
  EXPECT_EQ(parse_flight_line("partrain: at failure, in allreduce #1"), "");  // no [PATH]
  EXPECT_EQ(parse_flight_line(format_lost_rank_line(2, "x")), "");
  EXPECT_EQ(parse_lost_rank_line(line), -1);
  EXPECT_EQ(parse_stopped_line(line), -1);
}

TEST(WorkerLines, HeartbeatLineIsExactlyItself) {
  EXPECT_EQ(std::string(kHeartbeatLine), "partrain: heartbeat");
  EXPECT_TRUE(is_heartbeat_line(kHeartbeatLine));
  EXPECT_FALSE(is_heartbeat_line("partrain: heartbeat "));
  EXPECT_FALSE(is_heartbeat_line("[rank 0] partrain: heartbeat"));
  EXPECT_FALSE(is_heartbeat_line(""));
  EXPECT_EQ(parse_epoch_line(kHeartbeatLine), 0);
  EXPECT_EQ(parse_stopped_line(kHeartbeatLine), -1);
}

TEST(WorkerLines, CountBeforeATerminator) {
  EXPECT_EQ(parse_count_before("1234567890/", '/'), 1234567890);  // past an int
  EXPECT_EQ(parse_count_before("999999999999999999 ", ' '), 999999999999999999);
  EXPECT_EQ(parse_count_before("1000000000000000000 ", ' '), std::nullopt);  // 19 digits
  EXPECT_EQ(parse_count_before("12", ' '), std::nullopt);
}

}  // namespace
}  // namespace partrain
