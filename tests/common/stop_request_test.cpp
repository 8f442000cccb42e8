// The worker's stop signals: recorded, not fatal; a repeat inside the window is the same
// request; a signal while the stop's checkpoint is written ends the process by that signal;
// in the start-up one ends the process at once, exit 75 with its line.
#include "common/stop_request.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "common/abrupt_exit.h"

namespace partrain {
namespace {

TEST(StopRequest, ASignalIsRecordedNotFatal) {
  {
    StopRequest stop;
    EXPECT_FALSE(StopRequest::requested());
    std::raise(SIGTERM);
    EXPECT_TRUE(StopRequest::requested());
    EXPECT_EQ(StopRequest::signal(), SIGTERM);
    // The same stop by a second path, inside the window: the first signal is kept.
    std::raise(SIGINT);
    EXPECT_EQ(StopRequest::signal(), SIGTERM);
  }
  // A new watcher starts without a request.
  StopRequest again;
  EXPECT_FALSE(StopRequest::requested());
#ifndef _WIN32
  std::raise(SIGUSR1);
  EXPECT_EQ(StopRequest::signal(), SIGUSR1);
  EXPECT_STREQ(StopRequest::signal_name(SIGUSR1), "SIGUSR1");
#endif
  EXPECT_STREQ(StopRequest::signal_name(SIGTERM), "SIGTERM");
  EXPECT_STREQ(StopRequest::signal_name(0), "a stop request");
}

// One stop often comes by two paths: the same signal twice inside the window is one request,
// on Windows too, whose C runtime sets a signal back to its default as it calls the handler.
TEST(StopRequest, TheSameSignalTwiceInsideTheWindowIsOneRequest) {
  StopRequest stop;
  std::raise(SIGTERM);
  std::raise(SIGTERM);  // the default action would end the test here
  EXPECT_EQ(StopRequest::signal(), SIGTERM);
#ifdef _WIN32
  // CTRL_BREAK_EVENT, the polite stop `partrain run` sends its workers on Windows.
  std::raise(SIGBREAK);
  std::raise(SIGBREAK);
  EXPECT_EQ(StopRequest::signal(), SIGTERM);  // still the first
  EXPECT_STREQ(StopRequest::signal_name(SIGBREAK), "CTRL_BREAK_EVENT");
#endif
}

// How the process ends when a stop signal takes its default action: by that signal on
// POSIX; on Windows the C runtime's default action exits with a non-zero code (3).
std::function<bool(int)> ended_by(int signal_number) {
#ifdef _WIN32
  (void)signal_number;
  return [](int status) { return status != 0; };
#else
  return ::testing::KilledBySignal(signal_number);
#endif
}

TEST(StopRequestDeathTest, ASignalDuringTheSaveEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop;
        std::raise(SIGTERM);
        StopRequest::set_saving(true);
        std::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      ended_by(SIGTERM), "");
}

TEST(StopRequestDeathTest, ASignalAfterTheWindowEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop;
        std::raise(SIGINT);
        std::this_thread::sleep_for(
            std::chrono::duration<double>(StopRequest::kRepeatWindowSeconds + 0.2));
        std::raise(SIGINT);
        std::_Exit(0);  // not reached
      },
      ended_by(SIGINT), "");
}

// Before the first step nothing is saved: the signal ends the process at once with
// kExitStopped and one line naming it, without the rest of the start-up.
TEST(StopRequestDeathTest, ASignalInTheStartUpEndsTheProcessAsStopped) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop(/*in_start_up=*/true);
        std::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped),
      "^partrain: stopped during start-up by SIGTERM; run the same command to continue\n$");
#ifdef _WIN32
  EXPECT_EXIT(
      {
        StopRequest stop(/*in_start_up=*/true);
        std::raise(SIGBREAK);
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped),
      "^partrain: stopped during start-up by CTRL_BREAK_EVENT; run the same command to "
      "continue\n$");
#endif
}

// Once there are others to tell, the stop tells them why before the process ends; a teller
// that hangs (a store held by the main thread, or gone) holds the end at most
// kStartUpTellBound.
TEST(StopRequestDeathTest, AStopInTheStartUpTellsWhyFirst) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopRequest stop(/*in_start_up=*/true);
        stop.tell_on_start_up_stop([](const std::string& why) {
          std::fprintf(stderr, "told: %s\n", why.c_str());
          std::fflush(stderr);
        });
        std::raise(SIGTERM);
        // POSIX: the handler only woke the teller's thread, which ends the process; bounded.
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped),
      "^told: SIGTERM before its first step\npartrain: stopped during start-up by SIGTERM");
  // The child would _Exit(0) after 10 s: 75 says the bound ended it.
  EXPECT_EXIT(
      {
        StopRequest stop(/*in_start_up=*/true);
        stop.tell_on_start_up_stop(
            [](const std::string&) { std::this_thread::sleep_for(std::chrono::seconds(30)); });
        std::raise(SIGINT);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped), "stopped during start-up by SIGINT");
}

// What an ordinary exit removes by destructors, a stop that ends the process at once in its
// start-up removes first: the paths held then, not those let go before.
TEST(StopRequestDeathTest, AStopInTheStartUpRemovesTheHeldFiles) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // One name for the test and the child that runs each statement (threadsafe death tests start
  // this program again, with a pid of its own).
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "partrain-abrupt";
  std::filesystem::create_directories(dir);
  const std::string held = (dir / "partrain.lock").string();
  const std::string let_go = (dir / "let-go").string();
  for (const std::string& path : {held, let_go}) std::ofstream(path) << "x";
  EXPECT_EXIT(
      {
        const RemovedAtAbruptExit keep(let_go);  // let go again, below
        { const RemovedAtAbruptExit dropped(let_go); }
        StopRequest stop(/*in_start_up=*/true);
        const RemovedAtAbruptExit lock(held);
        std::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped), "stopped during start-up");
  EXPECT_FALSE(std::filesystem::exists(held));
  // `keep` still held it: removed too. A path held by none is left.
  EXPECT_FALSE(std::filesystem::exists(let_go));
  std::ofstream(let_go) << "x";
  EXPECT_EXIT(
      {
        { const RemovedAtAbruptExit dropped(let_go); }
        StopRequest stop(/*in_start_up=*/true);
        std::raise(SIGTERM);
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(kExitStopped), "stopped during start-up");
  EXPECT_TRUE(std::filesystem::exists(let_go));
  std::filesystem::remove_all(dir);
}

TEST(StopRequest, FromTheFirstStepASignalIsARequestAgain) {
  StopRequest stop(/*in_start_up=*/true);
  bool told = false;
  stop.tell_on_start_up_stop([&told](const std::string&) { told = true; });
  StopRequest::steps_begin();
  std::raise(SIGINT);
  EXPECT_TRUE(StopRequest::requested());
  EXPECT_EQ(StopRequest::signal(), SIGINT);
  EXPECT_FALSE(told);
}

}  // namespace
}  // namespace partrain
