// defines: add_data_command() — `partrain data synth` (write the synthetic set as a
// CIFAR-100 binary dataset) and `partrain data fetch` (download, verify and extract
// CIFAR-100).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "common/errors.h"
#include "trainer/data/cifar_reader.h"
#include "trainer/data/download.h"
#include "trainer/data/synthetic.h"

namespace partrain::cli {

namespace {

struct SynthArgs {
  std::string format;
  std::string out;
  std::int64_t train = 50000;
  std::int64_t test = 10000;
  std::uint64_t seed = 0;
};

struct FetchArgs {
  std::string dataset;
  std::string dir = "data";
  std::string url;
  std::string md5;
  double stall_timeout_s = 60.0;
};

void run_synth(const SynthArgs& args) {
  PARTRAIN_CHECK(args.format == "cifar100-bin", UsageError, "data synth: format '", args.format,
                 "' is not supported (only cifar100-bin)");
  PARTRAIN_CHECK(args.train >= 1 && args.test >= 1, UsageError,
                 "data synth: --train and --test must be >= 1");
  std::error_code ec;
  std::filesystem::create_directories(args.out, ec);
  PARTRAIN_CHECK(!ec, UsageError, "data synth: cannot create ", args.out, ": ", ec.message());
  for (const bool train : {true, false}) {
    data::SyntheticOptions options;
    options.size = train ? args.train : args.test;
    options.train = train;
    options.seed = args.seed;
    const std::string path =
        (std::filesystem::path(args.out) / (train ? "train.bin" : "test.bin")).string();
    data::write_cifar100_bin(data::generate_synthetic(options), path);
    std::cout << "wrote " << path << " (" << options.size << " records)\n";
  }
}

void run_fetch(const FetchArgs& args) {
  PARTRAIN_CHECK(args.dataset == "cifar100", UsageError, "data fetch: dataset '", args.dataset,
                 "' cannot be fetched (only cifar100; fashion-mnist comes with "
                 "`apt-get install dataset-fashion-mnist`)");
  data::FetchOptions options;
  options.url = args.url;
  options.md5 = args.md5;
  options.download.stall_timeout_s = args.stall_timeout_s;
  const std::string target = (std::filesystem::path(args.dir) / "cifar-100-binary").string();
  data::fetch_cifar100(target, options);
  std::cout << "fetched CIFAR-100 into " << target << " (train.bin, test.bin)\n";
}

}  // namespace

void add_data_command(CLI::App& app, int& exit_code) {
  auto* data =
      app.add_subcommand("data", "Prepare datasets: write a synthetic set, fetch CIFAR-100");
  data->require_subcommand(1);

  auto synth_args = std::make_shared<SynthArgs>();
  auto* synth = data->add_subcommand("synth", "Write the seeded synthetic set as a dataset");
  synth->add_option("--format", synth_args->format, "Output format (cifar100-bin)")->required();
  synth->add_option("--out", synth_args->out, "Output directory")->required();
  synth->add_option("--train", synth_args->train, "Training records")->capture_default_str();
  synth->add_option("--test", synth_args->test, "Test records")->capture_default_str();
  synth->add_option("--seed", synth_args->seed, "Seed")->capture_default_str();
  synth->callback([synth_args, &exit_code] {
    run_synth(*synth_args);
    exit_code = 0;
  });

  auto fetch_args = std::make_shared<FetchArgs>();
  auto* fetch = data->add_subcommand("fetch", "Download, verify and extract a dataset");
  fetch->add_option("dataset", fetch_args->dataset, "Dataset (cifar100)")->required();
  fetch->add_option("--dir", fetch_args->dir, "Directory that receives cifar-100-binary/")
      ->capture_default_str();
  fetch->add_option("--url", fetch_args->url,
                    "Archive url (default: the official one); a #md5=HEX suffix sets the "
                    "expected checksum");
  fetch->add_option("--md5", fetch_args->md5,
                    "Expected MD5 of the archive (default: the official archive's)");
  fetch
      ->add_option("--stall-timeout", fetch_args->stall_timeout_s,
                   "Give up when the transfer stalls this many seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  fetch->callback([fetch_args, &exit_code] {
    run_fetch(*fetch_args);
    exit_code = 0;
  });
}

}  // namespace partrain::cli
