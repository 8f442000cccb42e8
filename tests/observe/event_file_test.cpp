// TensorBoard's event file: the masked CRC32C against the published check value, the record
// framing, a written file's records laid end to end, and a disk that is full (/dev/full),
// which must leave the writer quiet rather than end the run. The file's contents are read
// back by tests/observe/check_tfevents.py in the whole-run test (tests/train/observe_run_test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/byte_codec.h"
#include "common/errors.h"
#include "tests/support/scratch_dir.h"
#include "trainer/observe/event_file.h"

namespace partrain {
namespace {

std::uint32_t mask(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TEST(EventFile, MaskedCrc32cOfTheCheckString) {
  // CRC32C("123456789") is 0xe3069283 (the Castagnoli polynomial's published check value).
  EXPECT_EQ(masked_crc32c("123456789"), mask(0xe3069283u));
  EXPECT_EQ(masked_crc32c(""), mask(0u));
}

TEST(EventFile, RecordFraming) {
  const std::string record = frame_event_record("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(get_le<std::uint64_t>(record.data()), 3u);
  EXPECT_EQ(get_le<std::uint32_t>(record.data() + 8), masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(get_le<std::uint32_t>(record.data() + 15), masked_crc32c("abc"));
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(EventFile, WritesFramedRecordsWhenFlushed) {
  testing::ScratchDir dir("partrain-event-file");
  std::string path;
  {
    EventFile file(dir.path().string());
    path = file.path();
    const std::string name = std::filesystem::path(path).filename().string();
    EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
    EXPECT_EQ(name.substr(name.rfind('.') + 1), std::to_string(::getpid())) << name;
    file.add(1, {{"train/loss", 2.5}, {"train/lr", 0.1}});
    // Buffered until flushed: nothing is on disk yet.
    EXPECT_EQ(std::filesystem::file_size(path), 0u);
    file.flush();
    EXPECT_TRUE(file.ok());
    file.add(2, {{"train/loss", 2.0}});
  }  // the destructor writes the last event
  const std::string bytes = read_all(path);
  // Three records (version, step 1, step 2), each a header, its data and a trailer that check.
  std::size_t pos = 0;
  int count = 0;
  while (pos < bytes.size()) {
    ASSERT_LE(pos + 12, bytes.size());
    const auto length = get_le<std::uint64_t>(bytes.data() + pos);
    ASSERT_LE(pos + 16 + length, bytes.size());
    EXPECT_EQ(get_le<std::uint32_t>(bytes.data() + pos + 8),
              masked_crc32c(std::string_view(bytes.data() + pos, 8)));
    const std::string_view data(bytes.data() + pos + 12, length);
    EXPECT_EQ(get_le<std::uint32_t>(bytes.data() + pos + 12 + length), masked_crc32c(data));
    // The tags are in the data as they are (protobuf strings).
    if (count == 0) {
      EXPECT_NE(data.find("brain.Event:2"), std::string_view::npos);
    } else if (count == 1) {
      EXPECT_NE(data.find("train/lr"), std::string_view::npos);
    } else {
      EXPECT_EQ(data.find("train/lr"), std::string_view::npos);
    }
    pos += 16 + length;
    ++count;
  }
  EXPECT_EQ(count, 3);
}

TEST(EventFile, FullDiskStopsTheFileNotTheRun) {
  EventFile file = EventFile::at_path("/dev/full");
  ::testing::internal::CaptureStderr();
  file.add(1, {{"train/loss", 1.0}});
  EXPECT_NO_THROW(file.flush());
  EXPECT_FALSE(file.ok());
  file.add(2, {{"train/loss", 1.0}});  // no-ops from here on, and no second warning
  file.flush();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("writing /dev/full failed"), std::string::npos) << err;
  EXPECT_NE(err.find("training goes on"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(EventFile, UnwritableFolderIsAUsageError) {
  EXPECT_THROW(EventFile("/nonexistent-partrain-folder"), UsageError);
}

}  // namespace
}  // namespace partrain
