// image-folder as a user meets it: `partrain run` with two DDP ranks on a folder of PNG and
// JPEG files of assorted sizes learns a pattern that separates the classes, a damaged file
// stops the run with exit code 2 naming the file, and a folder missing on one host stops the
// other ranks at once.
#include <cstdint>
#include <gtest/gtest.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

// Class 0: horizontal stripes, class 1: vertical stripes, both under noise; sizes vary so
// that data.image_size has to bring them to one.
void write_split(const fs::path& dir, int per_class, std::uint64_t seed) {
  cv::RNG rng(seed);
  for (int k = 0; k < 2; ++k) {
    const fs::path folder = dir / (k == 0 ? "horizontal" : "vertical");
    fs::create_directories(folder);
    for (int i = 0; i < per_class; ++i) {
      const int w = rng.uniform(20, 41), h = rng.uniform(20, 41);
      cv::Mat image(h, w, CV_8UC3);
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const bool bright = ((k == 0 ? y * 6 / h : x * 6 / w) % 2) == 0;
          const int v = (bright ? 200 : 50) + rng.uniform(-40, 41);
          image.at<cv::Vec3b>(y, x) = cv::Vec3b::all(static_cast<std::uint8_t>(v));
        }
      }
      const std::string name = std::to_string(i) + (i % 2 == 0 ? ".png" : ".jpg");
      ASSERT_TRUE(cv::imwrite((folder / name).string(), image));
    }
  }
}

fs::path write_folder_config(const fs::path& dir) {
  fs::path path = dir / "config.yaml";
  std::ofstream(path) << "name: folder\nseed: 1\ndevice: cpu\nstrategy: ddp\n"
                      << "launch: {nproc_per_node: 2}\ncomm: {backend: asio-ring, timeout_s: 30}\n"
                      << "data: {dataset: image-folder, root: " << (dir / "images").string()
                      << ", image_size: 16, batch_size: 16, num_workers: 2}\n"
                      << "model: {name: digitalnet, width: 8, norm: batch}\n"
                      << "train: {epochs: 3, threads: 1, optimizer: {name: sgd, lr: 0.05}}\n"
                      << "checkpoint: {every_epochs: 0, resume: never}\n"
                      << "output: {dir: " << (dir / "out").string() << "}\n";
  return path;
}

TEST(ImageFolderRun, TwoRanksLearnTheStripes) {
  const fs::path dir = scratch("image_folder_learns");
  write_split(dir / "images/train", 64, 1);
  write_split(dir / "images/val", 16, 2);
  const Result r = partrain("run " + write_folder_config(dir).string(), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const Json report = read_report(dir);
  EXPECT_EQ(report["env"]["world_size"], 2);
  EXPECT_GE(report["final"]["test_accuracy"].get<double>(), 0.9) << r.output;
}

TEST(ImageFolderRun, DamagedFileExitsTwoNamingIt) {
  const fs::path dir = scratch("image_folder_damaged");
  write_split(dir / "images/train", 4, 1);
  write_split(dir / "images/val", 2, 2);
  const fs::path victim = dir / "images/train/vertical/1.jpg";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  const Result r = partrain("run " + write_folder_config(dir).string(), dir);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(victim.string() + ": corrupt JPEG"), std::string::npos) << r.output;
}

// data.root may differ between hosts; a folder missing on one fails that rank only, after the
// ranks met and made their communicators. The others name it at once, and give its reason,
// which it set in the store before its communicators closed: over asio-ring rank 0's first
// collective finds rank 1's listener gone (before, it tried to connect until comm.timeout_s,
// 60 s here, and then said only that it could not), and rank 1, waiting for rank 0 to connect,
// finds rank 0 gone in the store, or the store gone with rank 0 (before, it waited out the
// timeout; that store holds no reason then); over Gloo rank 1 leaves without its closing
// barrier (before, it waited 10 s there for ranks that were not coming), and its connection
// closes. With three ranks, rank 0 finds rank 2's listener gone before it connected to rank 1,
// which waits for that connection: rank 0's transport, broken, says in the store that it left,
// and rank 1 traces the failure from it to rank 2 (before, it waited out the timeout).
TEST(ImageFolderRun, AFolderMissingOnOneHostStopsTheOthersAtOnce) {
  const fs::path dir = scratch("image_folder_one_host");
  write_split(dir / "images/train", 4, 1);
  write_split(dir / "images/val", 2, 2);
  const std::string tcp = "tcp://127.0.0.1:";
  const std::string missing = (dir / "elsewhere/train").string() + ": no such folder";
  struct Case {
    const char* name;
    const char* backend;
    std::string rendezvous;
    int world, odd;
    const char* lost;
    bool reason;  // whether the others can give the odd rank's reason
  };
  for (const Case& c :
       {Case{"ring", "asio-ring", "file://" + (dir / "ring").string(), 2, 1,
             "lost rank 1: asio-ring: cannot connect to rank 1: ", true},
        Case{"gloo", "gloo", "file://" + (dir / "gloo").string(), 2, 1,
             "lost rank 1: gloo: ", true},
        // Rank 0, the lower rank, would connect to rank 1: rank 1 finds it gone in the store.
        Case{"ring0", "asio-ring", "file://" + (dir / "ring0").string(), 2, 0,
             "lost rank 0: asio-ring: rank 0 left before it connected", true},
        // Over the tcp store rank 0 serves, the store went with it: rank 1 finds that while it
        // waits for rank 0's connection, or, slower than rank 0 to fail, while it still makes
        // its communicator.
        Case{"ring0tcp", "asio-ring", tcp + std::to_string(unused_port()), 2, 0,
             "the process serving the store (rank 0) has exited", false},
        Case{"ring3", "asio-ring", "file://" + (dir / "ring3").string(), 3, 2,
             "lost rank 2: asio-ring: ", true}}) {
    SCOPED_TRACE(c.name);
    std::string config = read_text(write_folder_config(dir));
    config.replace(config.find("asio-ring"), 9, c.backend);
    const fs::path cfg = dir / (std::string(c.name) + ".yaml");
    std::ofstream(cfg) << config;
    const EngineRanks ranks = run_engine_ranks(dir, cfg, c.name, c.rendezvous, c.world, c.odd,
                                               " --set data.root=" + (dir / "elsewhere").string());
    const auto& [odd_code, odd_output] = ranks.ranks[static_cast<std::size_t>(c.odd)];
    EXPECT_EQ(odd_code, 2) << odd_output;
    EXPECT_NE(odd_output.find(missing), std::string::npos) << odd_output;
    for (int rank = 0; rank < c.world; ++rank) {
      if (rank == c.odd) continue;
      const auto& [code, output] = ranks.ranks[static_cast<std::size_t>(rank)];
      EXPECT_EQ(code, 1) << output;
      EXPECT_NE(output.find(c.lost), std::string::npos) << output;
      const std::string told = "rank " + std::to_string(c.odd) + " (";
      if (c.reason) {
        EXPECT_NE(output.find(told), std::string::npos) << output;
        EXPECT_NE(output.find(") stopped: " + missing), std::string::npos) << output;
      }
    }
    EXPECT_LT(ranks.seconds, 10.0);  // Gloo's closing barrier alone took 10 s
  }
}

}  // namespace
