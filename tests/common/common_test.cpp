// The common library: check macros, atomic files, temporary directories, hashing, byte codecs.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "common/byte_codec.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/temp_dir.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Check, ThrowsTheNamedTypeWithTheMessageAndRecordsWhere) {
  try {
    PARTRAIN_CHECK(1 + 1 == 3, UsageError, "arithmetic is off by ", 1);
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "arithmetic is off by 1");
    EXPECT_EQ(e.source().rfind("common_test.cpp:", 0), 0u) << e.source();
  }
  EXPECT_NO_THROW(PARTRAIN_CHECK(true, UsageError, "never"));
}

TEST(Check, ComparisonFormsAppendBothValues) {
  try {
    const int ranks = 3;
    PARTRAIN_CHECK_LE(ranks, 2, CommError, "too many ranks");
    FAIL() << "no throw";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "too many ranks (got 3, expected <= 2)");
  }
  EXPECT_THROW(PARTRAIN_CHECK_EQ(std::string("a"), "b", Error, "x"), Error);
  EXPECT_NO_THROW(PARTRAIN_CHECK_NE(1, 2, Error, "x"));
  EXPECT_NO_THROW(PARTRAIN_CHECK_LT(1, 2, Error, "x"));
  EXPECT_NO_THROW(PARTRAIN_CHECK_GT(2, 1, Error, "x"));
  EXPECT_NO_THROW(PARTRAIN_CHECK_GE(2, 2, Error, "x"));
  int evaluated = 0;
  PARTRAIN_CHECK_EQ(++evaluated, 1, Error, "each operand once");
  EXPECT_EQ(evaluated, 1);
}

TEST(AtomicFile, WritesWholeFilesAndLeavesNoTempBehind) {
  TempDir dir("partrain-common-test");
  const std::string path = (dir.path() / "report.json").string();
  write_file_atomically(path, "first");
  write_file_atomically(path, std::string("second\0with a zero", 18));
  EXPECT_EQ(read_all(path), std::string("second\0with a zero", 18));
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(entry.path().filename(), "report.json");
  }
  EXPECT_EQ(entries, 1);
}

TEST(AtomicFile, AnUnwritablePathIsAUsageErrorNamingIt) {
  TempDir dir("partrain-common-test");
  const std::string path = (dir.path() / "missing" / "x.json").string();
  try {
    write_file_atomically(path, "x");
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_NE(temp_path_for(path), temp_path_for(path));
}

TEST(TempDir, IsOwnerOnlyAndRemovedWithEverythingInIt) {
  fs::path kept;
  {
    TempDir dir("partrain-common-test");
    kept = dir.path();
    ASSERT_TRUE(fs::is_directory(kept));
#if !defined(_WIN32)  // Windows keeps access rules in ACLs, not in these bits
    EXPECT_EQ(fs::status(kept).permissions() & fs::perms::all, fs::perms::owner_all);
#endif
    fs::create_directories(kept / "a" / "b");
    std::ofstream(kept / "a" / "b" / "c") << "x";
    TempDir other("partrain-common-test");
    EXPECT_NE(other.path(), kept);
  }
  EXPECT_FALSE(fs::exists(kept));
}

TEST(Hash, Fnv1aMatchesThePublishedVectors) {
  EXPECT_EQ(fnv1a_64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a_64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a_64("foobar"), 0x85944171f73967e8ull);
  static_assert(fnv1a_64("a") == 0xaf63dc4c8601ec8cull, "usable at compile time");
  EXPECT_EQ(hex_128(0x1, 0xabcdefull), "00000000000000010000000000abcdef");
  EXPECT_EQ(fnv1a_128_hex("a").size(), 32u);
  EXPECT_EQ(fnv1a_128_hex("a").substr(0, 16), "af63dc4c8601ec8c");
}

TEST(ByteCodec, LittleEndianWhateverTheHost) {
  std::uint8_t bytes[8] = {};
  put_le<std::uint32_t>(bytes, 0x01020304u);
  EXPECT_EQ(bytes[0], 0x04);
  EXPECT_EQ(bytes[3], 0x01);
  EXPECT_EQ(get_le<std::uint32_t>(bytes), 0x01020304u);
  put_le<std::uint64_t>(bytes, 0xF0E0D0C0B0A09080ull);
  EXPECT_EQ(bytes[0], 0x80);
  EXPECT_EQ(bytes[7], 0xF0);
  EXPECT_EQ(get_le<std::uint64_t>(bytes), 0xF0E0D0C0B0A09080ull);
}

}  // namespace
}  // namespace partrain
