// What a rank can see of another rank's process on its machine (peer_process.h): the mark's
// text and back, and on Linux real child processes that are stopped, killed, busy or idle.
#include "comm_backends/backends/peer_process.h"

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "comm_backends/store/store.h"
#include "tests/support/scratch_dir.h"

#if defined(__linux__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#endif

namespace partrain::comm {
namespace {

TEST(PeerProcess, AMarkReadsBackAsItWasWritten) {
  const ProcessMark mark{4242, 123456, "0b6f-boot", 4026531836, 1000};
  const std::string text = encode_process_mark(mark);
  EXPECT_EQ(text, "pid=4242 started=123456 kernel=0b6f-boot pidns=4026531836 uid=1000");
  EXPECT_EQ(decode_process_mark(text), mark);
  // A field a later build adds is passed over.
  EXPECT_EQ(decode_process_mark(text + " cgroup=/a"), mark);
}

TEST(PeerProcess, ATextThatIsNoMarkIsRefused) {
  for (const char* bad :
       {"", "pid=1", "pid=x started=1 kernel=k pidns=1 uid=0", "pid=1 started=1 kernel=k pidns=1",
        "pid=1 started=1 kernel=k pidns=1 uid", "pid=1 started=-1 kernel=k pidns=1 uid=0",
        "garbage"}) {
    EXPECT_FALSE(decode_process_mark(bad).has_value()) << bad;
  }
}

TEST(PeerProcess, AMarkOfAnotherMachineShowsNothing) {
  ProcessMark mark = this_process();
  mark.kernel = "another-boot";
  EXPECT_FALSE(look_at_process(mark, std::chrono::milliseconds(1)).has_value());
  mark = this_process();
  mark.pid_space += 1;  // another process-id namespace: its ids are not this one's
  EXPECT_FALSE(look_at_process(mark, std::chrono::milliseconds(1)).has_value());
}

TEST(PeerProcess, ARankThatPublishedNothingShowsNothing) {
  testing::ScratchDir dir;
  StoreOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  const std::unique_ptr<Store> store = open_store(dir.url(), options);
  EXPECT_FALSE(look_at_rank_process(*store, 3, std::chrono::milliseconds(500)).has_value());
  const std::string junk = "not a mark";
  store->set(process_key(3), std::vector<std::uint8_t>(junk.begin(), junk.end()));
  EXPECT_FALSE(look_at_rank_process(*store, 3, std::chrono::milliseconds(500)).has_value());
}

#if defined(__linux__)

// A child that does `what` until killed: "sleep" (idle), "spin" (busy).
pid_t start_child(const std::string& what) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    volatile std::uint64_t sum = 0;
    while (std::chrono::steady_clock::now() < end) {  // bounded: a minute, if never killed
      if (what == "sleep") {
        ::usleep(100000);
      } else {
        for (int i = 0; i < 1000000; ++i) sum = sum + static_cast<std::uint64_t>(i);
      }
    }
    ::_exit(0);
  }
  return pid;
}

// Field `field` of /proc/PID/stat (numbered as proc(5) numbers them, from 3 on); empty where
// there is none.
std::string stat_field(pid_t pid, int field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const auto close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(line.substr(close + 1));
  std::string value;
  for (int i = 3; i <= field; ++i) {
    if (!(fields >> value)) return "";
  }
  return value;
}

// The child's mark, as it would publish it: its pid and start time (field 22), this machine's
// the rest.
ProcessMark mark_of(pid_t pid) {
  ProcessMark mark = this_process();
  mark.pid = pid;
  mark.started = std::stoull(stat_field(pid, 22));
  return mark;
}

struct Child {
  explicit Child(const std::string& what) : pid(start_child(what)) {}
  ~Child() {
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t pid;
  bool reaped = false;
};

std::string look(const ProcessMark& mark) { return look_at_process(mark).value_or("(nothing)"); }

TEST(PeerProcess, ThisProcessIsSeenAlive) {
  const std::string seen = look(this_process());
  EXPECT_TRUE(seen.starts_with("is alive")) << seen;
}

TEST(PeerProcess, AStoppedChildIsSeenStoppedWithHowToResumeIt) {
  Child child("sleep");
  const ProcessMark mark = mark_of(child.pid);
  ASSERT_EQ(::kill(child.pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child.pid, &status, WUNTRACED), child.pid);  // it is stopped now
  EXPECT_EQ(look(mark), "is stopped (SIGSTOP or SIGTSTP): `kill -CONT " +
                            std::to_string(child.pid) + "` resumes it");
}

TEST(PeerProcess, AKilledChildIsSeenEndedReapedOrNot) {
  Child child("sleep");
  const ProcessMark mark = mark_of(child.pid);
  ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
  // Not yet reaped: a zombie, which has ended all the same. Bounded: a second at most.
  for (int i = 0; i < 200 && stat_field(child.pid, 3) != "Z"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(stat_field(child.pid, 3), "Z");
  EXPECT_TRUE(look(mark).starts_with("has ended without saying why")) << look(mark);
  ASSERT_EQ(::waitpid(child.pid, nullptr, 0), child.pid);
  child.reaped = true;
  EXPECT_TRUE(look(mark).starts_with("has ended without saying why")) << look(mark);
}

TEST(PeerProcess, AnotherProcessGivenTheSameIdIsNotTheOne) {
  Child child("sleep");
  ProcessMark mark = mark_of(child.pid);
  mark.started += 1;  // the rank's process started at another time: this is not it
  EXPECT_TRUE(look(mark).starts_with("has ended")) << look(mark);
}

TEST(PeerProcess, BusyAndIdleChildrenAreToldApart) {
  Child busy("spin");
  Child idle("sleep");
  const std::string busy_seen = look(mark_of(busy.pid));
  const std::string idle_seen = look(mark_of(idle.pid));
  // Two cores here, and a test beside this one may hold them: a spinning child may get less
  // than the half of a CPU that "running" takes, but never as little as an idle one.
  EXPECT_TRUE(busy_seen.starts_with("is running, using ") ||
              busy_seen.starts_with("is alive, using "))
      << busy_seen;
  EXPECT_TRUE(idle_seen.starts_with("is alive but idle (")) << idle_seen;
}

TEST(PeerProcess, ARankIsNamedWithItsPidFromWhatItPublished) {
  testing::ScratchDir dir;
  StoreOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  const std::unique_ptr<Store> store = open_store(dir.url(), options);
  Child child("sleep");
  const std::string text = encode_process_mark(mark_of(child.pid));
  store->set(process_key(1), std::vector<std::uint8_t>(text.begin(), text.end()));
  ASSERT_EQ(::kill(child.pid, SIGSTOP), 0);
  ASSERT_EQ(::waitpid(child.pid, nullptr, WUNTRACED), child.pid);
  const auto seen = look_at_rank_process(*store, 1, std::chrono::milliseconds(1000));
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(
      seen->starts_with("rank 1 (pid " + std::to_string(child.pid) + ", this machine) is stopped"))
      << *seen;
}

#endif

}  // namespace
}  // namespace partrain::comm
