#include "trainer/data/balance.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "common/errors.h"
#include "trainer/data/batch_plan.h"

namespace partrain::data {
namespace {

using Shares = std::vector<std::int64_t>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(WeightedShares, ProportionalAndSummingToTheMicroBatch) {
  EXPECT_EQ(weighted_shares(64, {3, 1}), (Shares{48, 16}));
  EXPECT_EQ(weighted_shares(64, {1, 1}), (Shares{32, 32}));
  EXPECT_EQ(weighted_shares(64, {0.75, 0.25}), (Shares{48, 16}));
  // 10 by 1:1:1 is 3.33 each: the one sample left goes to the first of the equal remainders.
  EXPECT_EQ(weighted_shares(10, {1, 1, 1}), (Shares{4, 3, 3}));
  // 10 by 2:1 is 6.67 and 3.33: the larger remainder (0.67) takes the sample left.
  EXPECT_EQ(weighted_shares(10, {2, 1}), (Shares{7, 3}));
  // 100 by 5:3:2:1 (45.45, 27.27, 18.18, 9.09): remainders .45 .27 .18 .09, one left -> rank 0.
  EXPECT_EQ(weighted_shares(100, {5, 3, 2, 1}), (Shares{46, 27, 18, 9}));
  for (std::int64_t m : {100, 101, 1000, 4097}) {
    const Shares s = weighted_shares(m, {0.3, 2.9, 1.7, 0.11, 5});
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), std::int64_t{0}), m) << m;
  }
}

TEST(WeightedShares, RefusesBadWeightsAndEmptySharesNamingTheNumbers) {
  EXPECT_EQ(error_of([] {
              weighted_shares(64, {3, 0});
            }),
            "rank 1's weight is 0; every weight must be > 0");
  EXPECT_EQ(error_of([] {
              weighted_shares(64, {-1, 2});
            }),
            "rank 0's weight is -1; every weight must be > 0");
  EXPECT_EQ(error_of([] {
              weighted_shares(8, {100, 1});
            }),
            "rank 1's share of 8 samples per micro-step rounds to 0 (weights 100,1); every rank "
            "needs at least 1 sample");
  EXPECT_THROW(weighted_shares(8, {}), UsageError);
}

TEST(SpeedShares, FollowTheSpeedAndKeepEveryRankASample) {
  // Rank 1 half as fast: two thirds to rank 0.
  EXPECT_EQ(speed_shares(256, {0.001, 0.002}), (Shares{171, 85}));
  EXPECT_EQ(speed_shares(256, {0.002, 0.002}), (Shares{128, 128}));
  // Rank 2 so slow that its quota rounds to 0: it keeps one sample, taken from the largest.
  EXPECT_EQ(speed_shares(8, {0.001, 0.001, 1.0}), (Shares{3, 4, 1}));
  EXPECT_THROW(speed_shares(8, {0.001, 0.0}), UsageError);
  EXPECT_THROW(speed_shares(1, {0.001, 0.001}), UsageError);
  // The speed split shortens the predicted step; the even one waits for the slow rank.
  EXPECT_DOUBLE_EQ(predicted_step_seconds({128, 128}, {0.001, 0.002}), 0.256);
  EXPECT_DOUBLE_EQ(predicted_step_seconds({171, 85}, {0.001, 0.002}), 0.171);
}

TEST(AutoBalance, MovesToTheSpeedSplitThenHalfWayAndHoldsWithinTheMargin) {
  AutoBalance balance({128, 128}, {2, 3, 0.05, 0.5});
  const std::vector<double> slow1{0.001, 0.002};
  std::int64_t step = 0;
  // Two warm-up steps are ignored, then 3 measured: the decision comes at the 5th.
  for (; step < 4; ++step) EXPECT_FALSE(balance.observe(step + 1, slow1)) << step;
  const auto change = balance.observe(++step, slow1);
  ASSERT_TRUE(change);
  EXPECT_EQ(change->step, 5);
  // The first move goes all the way to the speed split, 171:85.
  EXPECT_EQ(change->shares, (Shares{171, 85}));
  EXPECT_EQ(balance.shares(), (Shares{171, 85}));
  EXPECT_DOUBLE_EQ(change->predicted_before, 0.256);
  EXPECT_DOUBLE_EQ(change->predicted_after, 0.171);
  EXPECT_EQ(describe(*change),
            "step 5: shares 171,85 (busy s/sample 0.001,0.002; running 100%,100%; predicted "
            "step 0.256 s -> 0.171 s)");
  // The same speeds: it holds there.
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(balance.observe(++step, slow1));
  // Noise within 5 %: the split holds.
  for (int i = 0; i < 12; ++i) EXPECT_FALSE(balance.observe(++step, {0.00102, 0.00199}));
  // Rank 0 becomes the slow one: within a few windows the split moves towards rank 1, half way
  // from 171:85 to the speed split of the running estimates.
  std::optional<BalanceChange> back;
  for (int i = 0; i < 9 && !back; ++i) back = balance.observe(++step, {0.004, 0.001});
  ASSERT_TRUE(back);
  const Shares target = speed_shares(256, back->seconds_per_sample);
  EXPECT_EQ(back->shares, weighted_shares(256, {0.5 * (171 + target[0]), 0.5 * (85 + target[1])}));
  EXPECT_LT(back->shares[0], 171);
  EXPECT_LT(back->predicted_after, back->predicted_before);
  // The figures are the window's means: one odd step among three moves the mean only.
  AutoBalance mean_of_window({10, 10}, {0, 3, 0.05, 0.5});
  EXPECT_FALSE(mean_of_window.observe(1, {0.001, 0.001}));
  EXPECT_FALSE(mean_of_window.observe(2, {0.001, 0.001}));
  const auto third = mean_of_window.observe(3, {0.001, 0.007});
  ASSERT_TRUE(third);
  EXPECT_DOUBLE_EQ(third->seconds_per_sample[1], 0.003);
  EXPECT_EQ(third->shares, (Shares{15, 5}));  // the speed split of 0.001:0.003
}

// The first move goes all the way, so it must promise twice the margin: ranks 15 % apart (the
// speed split 137:119 would gain 7 %) stay even; 30 % apart they move.
TEST(AutoBalance, TheFirstMoveNeedsTwiceTheMargin) {
  AutoBalance balance({128, 128}, {0, 1, 0.05, 1.0});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(balance.observe(i + 1, {0.001, 0.00115}));
  const auto change = balance.observe(6, {0.001, 0.0013});
  ASSERT_TRUE(change);
  EXPECT_EQ(change->shares, speed_shares(256, {0.001, 0.0013}));
}

// The decision to move weighs the speed split, not the half-way step: at 151:105 (the first
// move's, to the speed split of 1 and 1.438 ms a sample) with 0.492 and 0.803 ms a sample, the
// half-way split (155:101) gains under 5 % but the speed split (159:97) gains 7 %, so the split
// still moves. Judging by the half-way step stalls it here.
TEST(AutoBalance, KeepsMovingWhileTheSpeedSplitGainsEnough) {
  AutoBalance balance({128, 128}, {0, 1, 0.05, 1.0});
  const auto first = balance.observe(1, {0.001, 0.001438});
  ASSERT_TRUE(first);
  ASSERT_EQ(first->shares, (Shares{151, 105}));
  const auto change = balance.observe(2, {0.000492, 0.000803});
  ASSERT_TRUE(change);
  EXPECT_EQ(change->shares, (Shares{155, 101}));
}

// The fraction of the time each rank ran is recorded with a change and said in its line; the
// split follows the busy seconds alone (a stopped rank's stops are in them already).
TEST(AutoBalance, RecordsTheFractionOfTheTimeEachRankRan) {
  AutoBalance balance({128, 128}, {0, 2, 0.05, 0.5});
  EXPECT_FALSE(balance.observe(1, {0.001, 0.002}, {1.0, 0.6}));
  const auto change = balance.observe(2, {0.001, 0.002}, {1.0, 0.4});
  ASSERT_TRUE(change);
  EXPECT_DOUBLE_EQ(change->running[1], 0.5);
  EXPECT_EQ(change->shares, (Shares{171, 85}));
  EXPECT_EQ(describe(*change),
            "step 2: shares 171,85 (busy s/sample 0.001,0.002; running 100%,50%; predicted "
            "step 0.256 s -> 0.171 s)");
  // Equal busy seconds: nothing moves, whatever the fractions.
  AutoBalance even({128, 128}, {0, 2, 0.05, 0.5});
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(even.observe(i + 1, {0.001, 0.001}, {1.0, 0.5}));
}

// Options that judge a move on the first window after it, whatever its seconds (the steps of
// these tests are few).
AutoBalanceOptions judged_on_one_window(int window_steps, double smoothing = 1.0) {
  AutoBalanceOptions options;
  options.warmup_steps = 0;
  options.window_steps = window_steps;
  options.min_gain = 0.05;
  options.smoothing = smoothing;
  options.judge_windows = 1;
  options.judge_seconds = 0;
  return options;
}

// A move is judged by the steps after it: if their mean over the judged span is not 1 % faster than
// the mean since the previous change, the split goes back, and the next two windows only
// measure before another move is weighed.
TEST(AutoBalance, UndoesAMoveThatDidNotMakeTheStepsFaster) {
  AutoBalance balance({128, 128}, judged_on_one_window(2));
  const std::vector<double> rates{0.001, 0.0015};  // noise that promises a gain
  EXPECT_FALSE(balance.observe(1, rates, {}, 0.100));
  const auto move = balance.observe(2, rates, {}, 0.102);
  ASSERT_TRUE(move);
  ASSERT_FALSE(move->undo);
  EXPECT_EQ(move->shares, speed_shares(256, rates));
  EXPECT_DOUBLE_EQ(move->step_seconds, 0.101);  // the mean of 0.100 and 0.102
  EXPECT_EQ(describe(*move),
            "step 2: shares 154,102 (busy s/sample 0.001,0.0015; running 100%,100%; predicted "
            "step 0.192 s -> 0.154 s; steps took 0.101 s)");
  // Under the move the steps take 0.11 s: back to 128:128.
  EXPECT_FALSE(balance.observe(3, rates, {}, 0.110));
  const auto undo = balance.observe(4, rates, {}, 0.110);
  ASSERT_TRUE(undo);
  EXPECT_TRUE(undo->undo);
  EXPECT_EQ(undo->step, 4);
  EXPECT_EQ(undo->shares, (Shares{128, 128}));
  EXPECT_EQ(balance.shares(), (Shares{128, 128}));
  EXPECT_DOUBLE_EQ(undo->step_seconds, 0.110);
  EXPECT_DOUBLE_EQ(undo->before_move_seconds, 0.101);
  EXPECT_EQ(describe(*undo),
            "step 4: back to shares 128,128 (steps took 0.11 s after the move, 0.101 s before "
            "it; busy s/sample 0.001,0.0015; running 100%,100%)");
  // Two windows only measure; the third may move again (the first move's margin again).
  for (std::int64_t step = 5; step <= 8; ++step) {
    EXPECT_FALSE(balance.observe(step, rates, {}, 0.1)) << step;
  }
  EXPECT_FALSE(balance.observe(9, rates, {}, 0.1));
  const auto again = balance.observe(10, rates, {}, 0.1);
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->undo);
  EXPECT_EQ(again->shares, speed_shares(256, rates));
}

// A move waits for the span it will be judged on, before it and after it: the steps since the
// last change must cover judge_windows windows and judge_seconds, and so must those after it.
TEST(AutoBalance, AMoveWaitsForItsSpanBeforeAndAfter) {
  AutoBalanceOptions options = judged_on_one_window(2);
  options.judge_windows = 2;
  options.judge_seconds = 0.5;
  AutoBalance balance({128, 128}, options);
  const std::vector<double> slow1{0.001, 0.002};
  std::int64_t step = 0;
  // 0.1 s steps: four steps are two windows but 0.4 s; the sixth step makes 0.6 s.
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(balance.observe(++step, slow1, {}, 0.1)) << step;
  const auto move = balance.observe(++step, slow1, {}, 0.1);
  ASSERT_TRUE(move);
  EXPECT_EQ(move->step, 6);
  // The steps after it are faster; judged (and kept) once they too span 0.5 s and two windows.
  for (int i = 0; i < 12; ++i) EXPECT_FALSE(balance.observe(++step, slow1, {}, 0.07)) << step;
  EXPECT_EQ(balance.shares(), move->shares);
}

// Where no split makes the steps faster (a rank away for whole steps in slices), each move is
// taken back and the windows that only measure double after each undo in a row (2, 4, 8, ...
// up to the cap), so the tries die out.
TEST(AutoBalance, BacksOffAfterEachMoveThatDidNotPay) {
  AutoBalanceOptions options = judged_on_one_window(1);
  options.windows_after_undo = 2;
  options.max_windows_after_undo = 8;
  AutoBalance balance({128, 128}, options);
  const std::vector<double> rates{0.001, 0.002};  // the speed split promises a gain
  std::int64_t step = 0;
  // Observes windows until the split changes; returns the change and how many windows it took.
  auto until_change = [&](double step_seconds) {
    for (int windows = 1; windows <= 100; ++windows) {
      if (auto change = balance.observe(++step, rates, {}, step_seconds)) {
        return std::make_pair(*change, windows);
      }
    }
    ADD_FAILURE() << "no change in 100 windows";
    return std::make_pair(BalanceChange{}, 0);
  };
  // Steps take 0.1 s under either split: every move is undone. Quiet windows after the k-th
  // undo: 2, 4, 8, 8 (the cap); the move comes in the window after them.
  std::vector<int> waits;
  for (int trial = 0; trial < 5; ++trial) {
    const auto [move, before_move] = until_change(0.1);
    ASSERT_FALSE(move.undo) << trial;
    if (trial > 0) waits.push_back(before_move);
    const auto [undo, before_undo] = until_change(0.1);
    ASSERT_TRUE(undo.undo) << trial;
    EXPECT_EQ(before_undo, 1) << trial;  // judged on the first window under the move
    EXPECT_EQ(balance.shares(), (Shares{128, 128}));
  }
  EXPECT_EQ(waits, (std::vector<int>{3, 5, 9, 9}));
}

// A move whose steps got faster stays, and so does one whose steps were not measured; a step
// far beyond the others (the whole machine paused) stays out of the mean. Later, half-way
// moves are judged too: slower steps after one take it back, to the split before it.
TEST(AutoBalance, KeepsAMoveThatMadeTheStepsFaster) {
  const std::vector<double> slow1{0.001, 0.002};
  AutoBalance faster({128, 128}, judged_on_one_window(3));
  for (std::int64_t step = 1; step <= 2; ++step)
    EXPECT_FALSE(faster.observe(step, slow1, {}, 0.26));
  ASSERT_TRUE(faster.observe(3, slow1, {}, 0.26));
  const Shares moved = faster.shares();
  EXPECT_FALSE(faster.observe(4, slow1, {}, 0.17));
  EXPECT_FALSE(faster.observe(5, slow1, {}, 5.0));  // over 20x the median: left out
  EXPECT_FALSE(faster.observe(6, slow1, {}, 0.17));
  for (std::int64_t step = 7; step <= 30; ++step) {
    EXPECT_FALSE(faster.observe(step, slow1, {}, 0.17)) << step;
  }
  EXPECT_EQ(faster.shares(), moved);
  const std::vector<double> slow0{0.004, 0.001};
  std::optional<BalanceChange> later;
  std::int64_t step = 31;
  for (; step < 40 && !later; ++step) later = faster.observe(step, slow0, {}, 0.17);
  ASSERT_TRUE(later);
  ASSERT_FALSE(later->undo);
  EXPECT_DOUBLE_EQ(later->step_seconds, 0.17);
  std::optional<BalanceChange> back;
  for (int i = 0; i < 3 && !back; ++i) back = faster.observe(step++, slow0, {}, 0.3);
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->undo);
  EXPECT_EQ(faster.shares(), moved);

  AutoBalance unmeasured({128, 128}, {0, 1, 0.05, 1.0});
  ASSERT_TRUE(unmeasured.observe(1, slow1));
  for (std::int64_t step = 2; step <= 10; ++step) EXPECT_FALSE(unmeasured.observe(step, slow1));
  EXPECT_EQ(unmeasured.shares(), (Shares{171, 85}));
}

TEST(AutoBalance, RunningEstimateDampsOneOddWindow) {
  // smoothing 0.5: after windows of 0.001 and then one of 0.003, rank 1's estimate is 0.002.
  AutoBalance balance({10, 10}, {0, 1, 0.05, 0.5});
  EXPECT_FALSE(balance.observe(1, {0.001, 0.001}));
  const auto change = balance.observe(2, {0.001, 0.003});
  ASSERT_TRUE(change);
  EXPECT_DOUBLE_EQ(change->seconds_per_sample[1], 0.002);
  // The speed split of 0.001:0.002 is 13.3:6.7 -> 13:7, where the first move goes.
  EXPECT_EQ(change->shares, (Shares{13, 7}));
}

TEST(AutoBalance, OneRankOrAMissingFigureChangesNothing) {
  AutoBalance one({64}, {0, 1, 0.05, 0.5});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(one.observe(i + 1, {0.5}));
  AutoBalance missing({32, 32}, {0, 2, 0.05, 0.5});
  EXPECT_FALSE(missing.observe(1, {0.001, 0.0}));
  EXPECT_FALSE(missing.observe(2, {0.001, 0.0}));
  EXPECT_EQ(missing.shares(), (Shares{32, 32}));
}

TEST(AutoBalance, SharesItChoosesMakeABatchPlanOfTheSameMicroSteps) {
  const BatchPlan even(100, 3, BatchPlan::even_shares(20, 2));
  const BatchPlan moved(100, 3, speed_shares(20, {0.001, 0.003}));
  EXPECT_EQ(moved.shares(), (Shares{15, 5}));
  ASSERT_EQ(moved.num_steps(), even.num_steps());
  for (std::int64_t k = 0; k < even.num_steps(); ++k) {
    std::vector<std::int64_t> a = even.indices(1, k, 0), b = moved.indices(1, k, 0);
    const std::vector<std::int64_t> a1 = even.indices(1, k, 1), b1 = moved.indices(1, k, 1);
    a.insert(a.end(), a1.begin(), a1.end());
    b.insert(b.end(), b1.begin(), b1.end());
    EXPECT_EQ(a, b) << "micro-step " << k;
  }
}

}  // namespace
}  // namespace partrain::data
