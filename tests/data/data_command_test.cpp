// End-to-end tests of `partrain data synth` and `partrain data fetch` through the built
// executable (PARTRAIN_EXE, set by CTest).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/data/loopback_http_server.h"
#include "tests/data/scratch_files.h"
#include "tests/data/tar_gz.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/download.h"
#include "trainer/data/synthetic.h"

namespace partrain::data {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult run_partrain(const std::string& args) {
  const char* exe = std::getenv("PARTRAIN_EXE");
  RunResult result;
  if (exe == nullptr) return result;
  // coreutils' timeout bounds a hung child.
  const std::string command = "timeout 60 '" + std::string(exe) + "' " + args + " 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The official archive's layout with 8 synthetic records per split, written to DIR/a.tgz too.
std::vector<std::uint8_t> small_cifar100_archive(const ScratchDir& dir) {
  SyntheticOptions o;
  o.size = 8;
  write_cifar100_bin(generate_synthetic(o), dir / "train.bin");
  write_cifar100_bin(generate_synthetic(o), dir / "test.bin");
  const auto archive = test_files::make_tar_gz(
      {test_files::TarEntry::file("cifar-100-binary/train.bin",
                                  test_files::read_bytes(dir / "train.bin")),
       test_files::TarEntry::file("cifar-100-binary/test.bin",
                                  test_files::read_bytes(dir / "test.bin"))});
  test_files::write_bytes(dir / "a.tgz", archive);
  return archive;
}

class DataCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("PARTRAIN_EXE") == nullptr) GTEST_SKIP() << "PARTRAIN_EXE not set";
  }
  // A two-rank run's config, NAME.yaml in the scratch folder, whose ranks download the data
  // set from `url` into it; its path.
  std::string download_config(const std::string& name, const std::string& url) const {
    const std::string config = dir_.string() + "/" + name + ".yaml";
    const std::string yaml = "name: " + name +
                             "\nseed: 0\ndevice: cpu\nstrategy: ddp\n"
                             "comm: {backend: asio-ring, timeout_s: 20}\n"
                             "data: {dataset: cifar100, root: '" +
                             dir_.string() + "/data/cifar-100-binary', download: true, url: '" +
                             url +
                             "', batch_size: 4, num_workers: 1}\n"
                             "model: {name: digitalnet, width: 4}\n"
                             "train: {epochs: 1, threads: 1}\n"
                             "checkpoint: {every_epochs: 0, resume: never}\n";
    test_files::write_bytes(config, std::vector<std::uint8_t>(yaml.begin(), yaml.end()));
    return config;
  }
  // A file of the scratch folder, as text.
  std::string text(const std::string& name) const {
    const auto bytes = test_files::read_bytes(dir_ / name);
    return std::string(bytes.begin(), bytes.end());
  }
  ScratchDir dir_;
};

TEST_F(DataCommand, SynthWritesTheSyntheticSetInCifar100Format) {
  const RunResult r = run_partrain("data synth --format cifar100-bin --out '" + dir_.string() +
                                   "/syn' --train 150 --test 40 --seed 5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("train.bin (150 records)"));
  const ImageDataset train = read_cifar100_bin(dir_ / "syn/train.bin");
  const ImageDataset test = read_cifar100_bin(dir_ / "syn/test.bin");
  EXPECT_EQ(test.size, 40);
  SyntheticOptions o;
  o.size = 150;
  o.seed = 5;
  const ImageDataset expected = generate_synthetic(o);
  EXPECT_EQ(train.pixels, expected.pixels);
  EXPECT_EQ(train.labels, expected.labels);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "syn"),
                          std::filesystem::directory_iterator()),
            2);  // no temp files left
}

TEST_F(DataCommand, BadArgumentsExitTwoWithOneLine) {
  RunResult r = run_partrain("data synth --format png --out '" + dir_.string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "partrain: data synth: format 'png' is not supported (only cifar100-bin)\n");
  r = run_partrain("data fetch mnist --dir '" + dir_.string() + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("dataset 'mnist' cannot be fetched"));
  r = run_partrain("data synth --out x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--format is required"));
}

TEST_F(DataCommand, FetchDownloadsVerifiesAndExtracts) {
  const auto archive = small_cifar100_archive(dir_);
  const std::string md5 = md5_file(dir_ / "a.tgz");
  test_files::LoopbackHttpServer server({{"/c.tgz", archive}});

  RunResult r = run_partrain("data fetch cifar100 --dir '" + dir_.string() + "/data' --url " +
                             server.url("/c.tgz") + " --md5 " + md5);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_cifar100_bin(dir_ / "data/cifar-100-binary/train.bin").size, 8);

  r = run_partrain("data fetch cifar100 --dir '" + dir_.string() + "/bad' --url " +
                   server.url("/c.tgz"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("checksum mismatch"));
  EXPECT_THAT(r.output, HasSubstr(std::string("expected ") + kCifar100Md5));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1);

  r = run_partrain("data fetch cifar100 --dir '" + dir_.string() + "/bad' --url " +
                   server.url("/nothing.tgz"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("HTTP status 404"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "bad/cifar-100-binary/train.bin"));
}

// The ranks that wait for the first local rank's download wait as long as the download may
// take, not comm.timeout_s: here the server answers 4 s late and the timeout is 2 s.
TEST_F(DataCommand, RanksWaitForASlowDownloadBeyondTheCommTimeout) {
#ifndef PARTRAIN_WITH_TORCH
  GTEST_SKIP() << "partrain run needs LibTorch; this build has PARTRAIN_WITH_TORCH=OFF";
#endif
  const auto archive = small_cifar100_archive(dir_);
  const std::string md5 = md5_file(dir_ / "a.tgz");
  test_files::LoopbackHttpServer server({{"/c.tgz", archive}}, false, std::chrono::seconds(4));
  const std::string config = dir_.string() + "/slow.yaml";
  const std::string yaml = std::string(
                               "name: slow\nseed: 0\ndevice: cpu\nstrategy: ddp\n"
                               "launch: {nproc_per_node: 2}\n"
                               "comm: {backend: asio-ring, timeout_s: 2}\n"
                               "data: {dataset: cifar100, root: '") +
                           dir_.string() +
                           "/data/cifar-100-binary', "
                           "download: true, url: '" +
                           server.url("/c.tgz") + "#md5=" + md5 +
                           "', "
                           "batch_size: 4, num_workers: 1}\n"
                           "model: {name: digitalnet, width: 4}\n"
                           "train: {epochs: 1, threads: 1}\n"
                           "checkpoint: {every_epochs: 0, resume: never}\n"
                           "output: {dir: '" +
                           dir_.string() + "/out'}\n";
  test_files::write_bytes(config, std::vector<std::uint8_t>(yaml.begin(), yaml.end()));
  RunResult r = run_partrain("run '" + config + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(server.requests(), 1) << "one download per machine";
  EXPECT_TRUE(std::filesystem::exists(dir_ / "out/report.json")) << r.output;
}

// When the first local rank cannot download the data, the ranks that waited for it stop with
// its reason, not only its rank: each rank started as an engine starts it (its own output,
// which may be a file of its own), a file store, the archive missing on the server.
TEST_F(DataCommand, RanksThatWaitedForAFailedDownloadSayWhyItFailed) {
#ifndef PARTRAIN_WITH_TORCH
  GTEST_SKIP() << "partrain run needs LibTorch; this build has PARTRAIN_WITH_TORCH=OFF";
#endif
  const char* exe = std::getenv("PARTRAIN_EXE");
  ASSERT_NE(exe, nullptr);
  test_files::LoopbackHttpServer server({{"/c.tgz", {1, 2, 3}}});
  const std::string url = server.url("/missing.tgz");
  const std::string config = download_config("failed", url);
  const std::string d = dir_.string();
  const std::string ranks =
      "cd '" + d +
      "' && for r in 0 1; do (RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 "
      "PARTRAIN_RENDEZVOUS=file://" +
      d + "/rdzv timeout 60 '" + exe + "' worker '" + config + "' --set output.dir=" + d +
      "/out$r > rank$r.txt 2>&1; echo $? > rank$r.rc) & done; wait";
  ASSERT_EQ(std::system(ranks.c_str()), 0);
  EXPECT_EQ(text("rank0.rc"), "2\n") << text("rank0.txt");
  EXPECT_THAT(text("rank0.txt"), HasSubstr("download of " + url + " failed: HTTP status 404"));
  EXPECT_EQ(text("rank1.rc"), "2\n") << text("rank1.txt");
  EXPECT_THAT(text("rank1.txt"), HasSubstr("rank 0 could not load the data set: download of " +
                                           url + " failed: HTTP status 404"));
}

// A stop to the first local rank alone while it downloads (a stop signal in its start-up ends
// it without setting the key the others wait on) ends the wait of the ranks that wait for it
// within a few seconds, as the same stop, instead of after the download's bound: each rank
// started as an engine starts it, a file store, a server that would answer after 120 s.
TEST_F(DataCommand, RanksWaitingForADownloadStopWithTheRankThatStoppedInIt) {
#ifndef PARTRAIN_WITH_TORCH
  GTEST_SKIP() << "partrain run needs LibTorch; this build has PARTRAIN_WITH_TORCH=OFF";
#endif
  const char* exe = std::getenv("PARTRAIN_EXE");
  ASSERT_NE(exe, nullptr);
  const auto archive = small_cifar100_archive(dir_);
  test_files::LoopbackHttpServer server({{"/c.tgz", archive}}, false, std::chrono::seconds(120));
  const std::string config = download_config("stopped", server.url("/c.tgz"));
  const std::string d = dir_.string();
  // Rank 0 without coreutils' timeout, so that its pid is the worker's: the download's own
  // timeouts bound it, and the stop below ends it.
  const std::string env =
      "PARTRAIN_RENDEZVOUS=file://" + d + "/rdzv WORLD_SIZE=2 LOCAL_WORLD_SIZE=2";
  const std::string worker =
      "'" + std::string(exe) + "' worker '" + config + "' --set output.dir=" + d;
  const std::string ranks = "cd '" + d + "' && { (RANK=0 LOCAL_RANK=0 " + env + " " + worker +
                            "/out0 > rank0.txt 2>&1 & echo $! > rank0.pid; wait $!; echo $? > "
                            "rank0.rc) & (RANK=1 LOCAL_RANK=1 " +
                            env + " timeout 60 " + worker +
                            "/out1 > rank1.txt 2>&1; echo $? > rank1.rc) & wait; }";
  int ranks_status = -1;
  std::thread started([&] { ranks_status = std::system(ranks.c_str()); });
  // Bounded: 60 s for rank 0 to ask for the archive.
  for (int i = 0; i < 600 && server.requests() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(server.requests(), 1);
  const auto signalled = std::chrono::steady_clock::now();
  ::kill(std::stoi(text("rank0.pid")), SIGTERM);
  started.join();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  ASSERT_EQ(ranks_status, 0);
  EXPECT_EQ(text("rank0.rc"), "75\n") << text("rank0.txt");
  EXPECT_THAT(text("rank0.txt"), HasSubstr("partrain: stopped during start-up by SIGTERM; run"));
  EXPECT_EQ(text("rank1.rc"), "75\n") << text("rank1.txt");
  EXPECT_THAT(text("rank1.txt"),
              HasSubstr("partrain: stopped during start-up by SIGTERM to rank 0; run"));
  EXPECT_LT(took, 20.0) << text("rank1.txt");  // the slice is 5 s; the server answers at 120 s
}

}  // namespace
}  // namespace partrain::data
