// What a rank can see of another rank's process on its machine (peer_process.h): the mark's
// text and back, which marks this machine can look at, and a rank named from its mark.
#include "comm_backends/backends/peer_process.h"

#include <gtest/gtest.h>

#include <memory>

#include "comm_backends/store/store.h"
#include "tests/support/scratch_dir.h"

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

#if defined(__linux__) || defined(_WIN32)

std::string look(const ProcessMark& mark) { return look_at_process(mark).value_or("(nothing)"); }

TEST(PeerProcess, ThisProcessIsSeenAlive) {
  const std::string seen = look(this_process());
  EXPECT_TRUE(seen.starts_with("is alive")) << seen;
}

TEST(PeerProcess, AnotherProcessGivenTheSameIdIsNotTheOne) {
  ProcessMark mark = this_process();
  mark.started += 1;  // the rank's process started at another time: this is not it
  EXPECT_TRUE(look(mark).starts_with("has ended")) << look(mark);
}

#endif

#if defined(__linux__)

// The mark a rank published, read back and looked at: here this test's own process, which
// sleeps (idle) while it is watched. Stopped, killed and busy processes: process_state_test.
TEST(PeerProcess, ARankIsNamedWithItsPidFromWhatItPublished) {
  testing::ScratchDir dir;
  StoreOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  publish_process_on_join(options, 1);
  const std::unique_ptr<Store> store = open_store(dir.url(), options);
  const auto seen = look_at_rank_process(*store, 1, std::chrono::milliseconds(1000));
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->starts_with("rank 1 (pid " + std::to_string(current_process_id()) +
                                ", this machine) is alive but idle ("))
      << *seen;
}

#endif

}  // namespace
}  // namespace partrain::comm
