// The file store under the spellings a Windows user writes: drive letters, backslashes,
// file:///C:/... urls. The same directory reached through different spellings must be one
// store. On Linux only the url forms that exist there are checked.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "comm_backends/store/file_store.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

StoreOptions options() {
  StoreOptions o;
  o.token = "windows-paths";
  o.timeout = std::chrono::milliseconds(3000);
  return o;
}

std::vector<std::uint8_t> all_byte_values() {
  std::vector<std::uint8_t> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<std::uint8_t>(b));
  for (char c : std::string("\r\n\x1a\r")) bytes.push_back(static_cast<std::uint8_t>(c));
  return bytes;
}

// Every spelling of `dir` in `urls` opens the same store: a value set through the first is
// read through each of the others, binary bytes intact, and add() counts across all of them.
void expect_one_store(const std::vector<std::string>& urls) {
  auto first = open_store(urls.front(), options());
  first->set("bytes", all_byte_values());
  for (std::size_t i = 0; i < urls.size(); ++i) {
    auto store = open_store(urls[i], options());
    EXPECT_EQ(store->get("bytes"), all_byte_values()) << urls[i];
    EXPECT_EQ(store->add("counter", 1), static_cast<std::int64_t>(i + 1)) << urls[i];
  }
}

#ifdef _WIN32

std::string with_backslashes(std::string path) {
  for (char& c : path) c = c == '/' ? '\\' : c;
  return path;
}

TEST(WindowsPaths, DriveLetterSpellingsOpenOneStore) {
  ScratchDir dir;
  const std::string generic = dir.path().generic_string();  // C:/users/.../partrain-win-N
  ASSERT_GE(generic.size(), 3u);
  ASSERT_EQ(generic[1], ':') << generic;
  const std::string native = with_backslashes(generic);
  std::string lower_drive = generic;
  lower_drive[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(lower_drive[0])));
  expect_one_store({"file:///" + generic, "file://" + generic, "file:///" + native,
                    "file://" + native, "file:///" + lower_drive});
  EXPECT_EQ(parse_store_url("file:///" + generic).path, generic);
  EXPECT_EQ(parse_store_url("file://" + native).path, native);
}

TEST(WindowsPaths, DirectoryWithSpacesThroughPercentEscapes) {
  ScratchDir dir;
  const fs::path spaced = dir.path() / "rendezvous dir";
  std::string escaped = spaced.generic_string();
  const auto space = escaped.find(' ');
  escaped.replace(space, 1, "%20");
  expect_one_store({"file:///" + escaped, "file:///" + spaced.generic_string()});
  EXPECT_TRUE(fs::is_directory(spaced));
}

TEST(WindowsPaths, StoreCreatesNestedDirectoriesGivenWithBackslashes) {
  ScratchDir dir;
  const std::string nested = with_backslashes((dir.path() / "a" / "b" / "c").generic_string());
  auto store = open_store("file:///" + nested, options());
  store->set("k", {7});
  EXPECT_TRUE(fs::is_directory(dir.path() / "a" / "b" / "c"));
  EXPECT_EQ(store->get("k"), std::vector<std::uint8_t>{7});
}

TEST(WindowsPaths, UnusableDirectoryIsAUsageError) {
  // A drive letter that no system maps: the store cannot be made, and says where.
  try {
    open_store("file:///Q:/partrain-no-such-drive/x", options());
    GTEST_SKIP() << "drive Q: exists here";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Q:"), std::string::npos) << e.what();
  }
}

#else

TEST(WindowsPaths, PosixSpellingsOpenOneStore) {
  ScratchDir dir;
  const std::string path = dir.path().string();
  expect_one_store({"file://" + path, "file://localhost" + path, "file://" + path + "/"});
}

#endif

}  // namespace
}  // namespace partrain::comm
