// defines: `partrain export CHECKPOINT --out FILE [--safetensors FILE]` — one consolidated
// checkpoint (torch.load reads it; a sharded run's shards are gathered into it) and,
// optionally, the model's tensors as safetensors (trainer/loop/checkpoint_export.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "trainer/loop/checkpoint_export.h"

namespace partrain::cli {

namespace {

struct ExportArguments {
  std::string checkpoint;
  std::string out;
  std::string safetensors;
};

}  // namespace

void add_export_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "export",
      "Write a checkpoint (a sharded run's with its shards) as one file torch.load reads");
  auto args = std::make_shared<ExportArguments>();
  sub->add_option("checkpoint", args->checkpoint, "checkpoint file (epoch-NNNN.pt, best.pt, ...)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--out", args->out, "the consolidated checkpoint to write")->required();
  sub->add_option("--safetensors", args->safetensors,
                  "also write the model's tensors here in the safetensors format");
  sub->callback([args, &exit_code] {
    const ExportSummary s = export_checkpoint(args->checkpoint, args->out, args->safetensors);
    std::printf(
        "exported %s: %zu model tensors, optimizer state of %zu parameters%s, %llu bytes\n",
        args->out.c_str(), s.tensors, s.optimizer_entries,
        s.shards > 0 ? (" gathered from " + std::to_string(s.shards) + " shards").c_str() : "",
        static_cast<unsigned long long>(s.bytes));
    if (!args->safetensors.empty()) std::printf("safetensors: %s\n", args->safetensors.c_str());
    exit_code = 0;
  });
}

}  // namespace partrain::cli
