// One run per output folder: the lock is taken and released, a second run (another token) is
// refused naming the holder, the nodes of one run (the same token) share it, and the lock of
// a process that is gone is taken over with a note.
#include "common/output_lock.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/temp_dir.h"

#ifndef _WIN32
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace partrain {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(OutputLock, TakenHeldAgainstAnotherRunAndReleased) {
  TempDir dir("partrain-lock");
  const std::string out = dir.string() + "/out";  // made by the lock
  std::vector<std::string> notes;
  auto note = [&notes](const std::string& line) { notes.push_back(line); };
  {
    OutputLock first(out, "token-a", note);
    EXPECT_TRUE(first.owned());
    const LockHolder holder = lock_from_text(read_all(first.path()), first.path());
    EXPECT_EQ(holder.token, "token-a");
    EXPECT_GT(holder.pid, 0);
    EXPECT_FALSE(holder.since.empty());

    try {
      OutputLock second(out, "token-b", note);
      ADD_FAILURE() << "a second run took the folder";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is in use by another run: pid " + std::to_string(holder.pid) +
                          " on host " + holder.host + " since " + holder.since),
                std::string::npos)
          << what;
    }
    // Another node of the same run shares the folder, and leaves the lock to its maker.
    {
      OutputLock node1(out, "token-a", note);
      EXPECT_FALSE(node1.owned());
    }
    EXPECT_TRUE(std::filesystem::exists(first.path()));
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/" + OutputLock::kFileName));
  EXPECT_TRUE(notes.empty());
  OutputLock again(out, "token-b", note);  // free again
  EXPECT_TRUE(again.owned());
}

#ifndef _WIN32
TEST(OutputLock, ALockOfAProcessThatIsGoneIsTakenOver) {
  TempDir dir("partrain-lock");
  const std::string out = dir.string();
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: the pid names no process now
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string path = out + "/" + OutputLock::kFileName;
  std::ofstream(path) << lock_to_text(
      {host, static_cast<int>(child), "2020-01-01T00:00:00Z", "token-dead"});
  std::vector<std::string> notes;
  OutputLock lock(out, "token-new", [&notes](const std::string& line) { notes.push_back(line); });
  EXPECT_TRUE(lock.owned());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("locked by pid " + std::to_string(child)), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("taking the stale lock over"), std::string::npos) << notes[0];
  EXPECT_EQ(lock_from_text(read_all(path), path).token, "token-new");
}

TEST(OutputLock, ALiveProcessOfAnotherHostIsNotTakenForStale) {
  TempDir dir("partrain-lock");
  const std::string path = dir.string() + "/" + OutputLock::kFileName;
  // A pid that does not run here: on another host that says nothing.
  std::ofstream(path) << lock_to_text({"some-other-host", 999999, "2020-01-01T00:00:00Z", "t"});
  EXPECT_THROW(OutputLock(dir.string(), "mine", [](const std::string&) {}), UsageError);
  EXPECT_EQ(lock_from_text(read_all(path), path).host, "some-other-host");
}
#endif

TEST(OutputLock, TextRoundTripAndGarbage) {
  const LockHolder in{"node-7", 4242, "2026-01-02T03:04:05Z", "abc123"};
  const LockHolder out = lock_from_text(lock_to_text(in), "x");
  EXPECT_EQ(out.host, in.host);
  EXPECT_EQ(out.pid, in.pid);
  EXPECT_EQ(out.since, in.since);
  EXPECT_EQ(out.token, in.token);
  EXPECT_THROW(lock_from_text("", "x"), UsageError);
  EXPECT_THROW(lock_from_text("host=a\npid=-3\n", "x"), UsageError);
  EXPECT_THROW(lock_from_text("pid=12\n", "x"), UsageError);
}

}  // namespace
}  // namespace partrain
