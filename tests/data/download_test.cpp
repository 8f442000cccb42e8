#include "trainer/data/download.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>

#include "tests/data/loopback_http_server.h"
#include "tests/data/scratch_files.h"
#include "tests/data/tar_gz.h"
#include "trainer/data/cifar_reader.h"

namespace partrain::data {
namespace {

namespace fs = std::filesystem;
using test_files::LoopbackHttpServer;
using test_files::make_tar_gz;
using test_files::read_bytes;
using test_files::TarEntry;
using test_files::usage_error_of;
using test_files::write_bytes;
using ::testing::HasSubstr;
using testing::ScratchDir;

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<std::uint8_t> cifar_records(int n, int first_label) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n * kCifarRecordBytes));
  for (int i = 0; i < n; ++i) {
    std::uint8_t* record = out.data() + i * kCifarRecordBytes;
    record[0] = 0;
    record[1] = static_cast<std::uint8_t>((first_label + i) % 100);
    std::fill(record + 2, record + kCifarRecordBytes, static_cast<std::uint8_t>(i));
  }
  return out;
}

// The layout of the official archive, with small train.bin / test.bin.
std::vector<std::uint8_t> cifar_archive(int train_records = 3) {
  return make_tar_gz(
      {TarEntry::dir("cifar-100-binary"),
       TarEntry::file("cifar-100-binary/train.bin", cifar_records(train_records, 10)),
       TarEntry::file("cifar-100-binary/test.bin", cifar_records(2, 50)),
       TarEntry::file("cifar-100-binary/fine_label_names.txt", bytes_of("apple\nfish\n"))});
}

std::string md5_of(const std::vector<std::uint8_t>& bytes) {
  ScratchDir dir;
  write_bytes(dir / "x", bytes);
  return md5_file(dir / "x");
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Md5, MatchesKnownDigests) {
  EXPECT_EQ(md5_of(bytes_of("abc")), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_of({}), "d41d8cd98f00b204e9800998ecf8427e");
}

TEST(Download, FetchesBytesAndReportsHttpErrors) {
  const auto payload = cifar_records(2, 0);
  LoopbackHttpServer server({{"/blob", payload}});
  ScratchDir dir;
  download_file(server.url("/blob"), dir / "blob");
  EXPECT_EQ(read_bytes(dir / "blob"), payload);

  EXPECT_THAT(usage_error_of([&] { download_file(server.url("/missing"), dir / "m"); }),
              HasSubstr("download of " + server.url("/missing") + " failed: HTTP status 404"));
  DownloadOptions small;
  small.max_bytes = 100;
  EXPECT_THAT(usage_error_of([&] { download_file(server.url("/blob"), dir / "big", small); }),
              HasSubstr("larger than 100 bytes"));
  EXPECT_THAT(usage_error_of([&] { download_file("ftp://127.0.0.1/x", dir / "f"); }),
              HasSubstr("download of ftp://127.0.0.1/x failed"));
  // Failed downloads leave nothing behind.
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"blob"});
}

TEST(Download, RefusedConnectionAndStalledServerAreBoundedErrors) {
  int closed_port = 0;
  {
    LoopbackHttpServer gone({});
    closed_port = gone.port();
  }
  ScratchDir dir;
  const std::string refused = "http://127.0.0.1:" + std::to_string(closed_port) + "/x";
  EXPECT_THAT(usage_error_of([&] { download_file(refused, dir / "x"); }),
              HasSubstr("download of " + refused + " failed"));

  LoopbackHttpServer stalled({}, /*stall=*/true);
  DownloadOptions quick;
  quick.stall_timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(usage_error_of([&] { download_file(stalled.url("/x"), dir / "x", quick); }),
              HasSubstr("timed out"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Extract, UnpacksFilesAndDirectories) {
  ScratchDir dir;
  write_bytes(dir / "a.tar.gz",
              make_tar_gz({TarEntry::dir("top"), TarEntry::file("top/one.txt", bytes_of("1")),
                           TarEntry::file("top/sub/two.txt", bytes_of("22"))}));
  extract_archive(dir / "a.tar.gz", dir / "out");
  EXPECT_EQ(read_bytes(dir / "out/top/one.txt"), bytes_of("1"));
  EXPECT_EQ(read_bytes(dir / "out/top/sub/two.txt"), bytes_of("22"));
}

TEST(Extract, RefusesEntriesThatEscapeOrLink) {
  ScratchDir dir;
  const std::vector<std::pair<TarEntry, std::string>> hostile = {
      {TarEntry::file("../evil.txt", bytes_of("x")),
       "refusing entry '../evil.txt' that climbs out"},
      {TarEntry::file("ok/../../evil.txt", bytes_of("x")), "climbs out of the target directory"},
      {TarEntry::file("/tmp/partrain-evil.txt", bytes_of("x")), "with an absolute path"},
      {TarEntry::link("link", "/etc/passwd"), "refusing entry 'link': only regular files"},
  };
  for (const auto& [entry, message] : hostile) {
    SCOPED_TRACE(entry.name);
    write_bytes(dir / "bad.tar.gz",
                make_tar_gz({TarEntry::file("fine.txt", bytes_of("ok")), entry}));
    EXPECT_THAT(usage_error_of([&] { extract_archive(dir / "bad.tar.gz", dir / "out/in"); }),
                HasSubstr(message));
  }
  EXPECT_FALSE(fs::exists(dir / "out/evil.txt"));
  EXPECT_FALSE(fs::exists(dir / "evil.txt"));
  EXPECT_FALSE(fs::exists("/tmp/partrain-evil.txt"));
  EXPECT_FALSE(fs::exists(dir / "out/in/link"));
}

TEST(Extract, RefusesGarbageAndArchiveBombs) {
  ScratchDir dir;
  write_bytes(dir / "junk.tar.gz", bytes_of("this is not an archive at all, not even close"));
  EXPECT_THAT(usage_error_of([&] { extract_archive(dir / "junk.tar.gz", dir / "out"); }),
              HasSubstr("junk.tar.gz:"));
  write_bytes(dir / "big.tar.gz",
              make_tar_gz({TarEntry::file("zeros.bin", std::vector<std::uint8_t>(1 << 20, 0))}));
  EXPECT_THAT(usage_error_of([&] { extract_archive(dir / "big.tar.gz", dir / "out", 1000); }),
              HasSubstr("unpacks to more than 1000 bytes"));
}

TEST(FetchCifar100, DownloadsVerifiesAndInstallsTheBinaryFiles) {
  const auto archive = cifar_archive();
  LoopbackHttpServer server({{"/cifar-100-binary.tar.gz", archive}});
  ScratchDir dir;
  FetchOptions options;
  options.url = server.url("/cifar-100-binary.tar.gz");
  options.md5 = md5_of(archive);
  const std::string target = dir / "cifar-100-binary";
  EXPECT_EQ(fetch_cifar100(target, options), target);
  EXPECT_EQ(listing(target),
            (std::vector<std::string>{"fine_label_names.txt", "test.bin", "train.bin"}));
  const ImageDataset train = read_cifar100_bin(target + "/train.bin");
  EXPECT_EQ(train.size, 3);
  EXPECT_EQ(train.labels, (std::vector<std::int64_t>{10, 11, 12}));
  // The staging folder is gone: the parent holds only the target.
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"cifar-100-binary"});

  // The checksum can travel in the url instead (#md5=, as pip writes it), in upper case too.
  std::string upper = md5_of(archive);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  FetchOptions via_url;
  via_url.url = server.url("/cifar-100-binary.tar.gz") + "#md5=" + upper;
  fetch_cifar100(dir / "again", via_url);
  EXPECT_TRUE(fs::exists(dir / "again/test.bin"));
}

// A staging folder that a killed fetch left goes at the next fetch, once nothing has written
// to it for longer than a fetch can last; a younger one may be another host's live fetch.
TEST(FetchCifar100, RemovesTheStagingThatAKilledFetchLeft) {
  const auto archive = cifar_archive();
  LoopbackHttpServer server({{"/c.tar.gz", archive}});
  ScratchDir dir;
  const auto left = [&](const std::string& name, std::chrono::seconds age) {
    const fs::path staging = dir / name;
    fs::create_directories(staging / "unpacked");
    write_bytes(staging / "cifar-100-binary.tar.gz", bytes_of("half an archive"));
    const auto then = fs::file_time_type::clock::now() - age;
    for (const fs::path& p : {staging / "cifar-100-binary.tar.gz", staging / "unpacked", staging})
      fs::last_write_time(p, then);
  };
  FetchOptions options;
  options.url = server.url("/c.tar.gz");
  options.md5 = md5_of(archive);
  options.download.total_timeout_s = 600;
  left("cifar.download-0ld", std::chrono::seconds(900));  // past 30 s + 600 s
  left("cifar.download-1ive", std::chrono::seconds(300));
  left("other.download-0ld", std::chrono::seconds(900));  // another target's
  fetch_cifar100(dir / "cifar", options);
  EXPECT_EQ(listing(dir.path()),
            (std::vector<std::string>{"cifar", "cifar.download-1ive", "other.download-0ld"}));
}

TEST(FetchCifar100, WrongChecksumInstallsNothing) {
  const auto archive = cifar_archive();
  LoopbackHttpServer server({{"/c.tar.gz", archive}});
  ScratchDir dir;
  FetchOptions options;
  options.url = server.url("/c.tar.gz");  // no checksum given: the official one is expected
  const std::string message = usage_error_of([&] { fetch_cifar100(dir / "cifar", options); });
  EXPECT_THAT(message, HasSubstr("checksum mismatch for " + options.url + ": MD5 " +
                                 md5_of(archive) + ", expected " + kCifar100Md5));
  EXPECT_TRUE(listing(dir / "cifar").empty());
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"cifar"});

  options.md5 = "not-a-checksum";
  EXPECT_THAT(usage_error_of([&] { fetch_cifar100(dir / "cifar", options); }),
              HasSubstr("is not 32 hex digits"));
  options.md5.clear();
  options.url += "#sha1=abc";
  EXPECT_THAT(usage_error_of([&] { fetch_cifar100(dir / "cifar", options); }),
              HasSubstr("the only fragment understood is #md5="));
}

TEST(FetchCifar100, MissingUrlAndMalformedArchivesAreErrors) {
  const auto no_test =
      make_tar_gz({TarEntry::file("cifar-100-binary/train.bin", cifar_records(1, 0))});
  auto bad_size = cifar_records(2, 0);
  bad_size.pop_back();
  const auto short_train =
      make_tar_gz({TarEntry::file("cifar-100-binary/train.bin", bad_size),
                   TarEntry::file("cifar-100-binary/test.bin", cifar_records(1, 0))});
  LoopbackHttpServer server({{"/no_test.tar.gz", no_test}, {"/short.tar.gz", short_train}});
  ScratchDir dir;
  FetchOptions options;
  options.url = server.url("/absent.tar.gz");
  EXPECT_THAT(usage_error_of([&] { fetch_cifar100(dir / "c", options); }),
              HasSubstr("HTTP status 404"));
  options.url = server.url("/no_test.tar.gz");
  options.md5 = md5_of(no_test);
  EXPECT_THAT(usage_error_of([&] { fetch_cifar100(dir / "c", options); }),
              HasSubstr("the archive has no cifar-100-binary/test.bin"));
  options.url = server.url("/short.tar.gz");
  options.md5 = md5_of(short_train);
  EXPECT_THAT(usage_error_of([&] { fetch_cifar100(dir / "c", options); }),
              HasSubstr("cifar-100-binary/train.bin is 6147 bytes, not a whole number"));
  EXPECT_TRUE(listing(dir / "c").empty());
}

}  // namespace
}  // namespace partrain::data
