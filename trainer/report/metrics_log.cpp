#include "trainer/report/metrics_log.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

void write_csv(const std::string& path, const std::vector<EpochRecord>& epochs) {
  std::ostringstream csv;
  csv << "epoch,seconds,train_seconds,train_images_per_s,images,steps,train_loss,test_loss,"
         "test_accuracy,test_accuracy_top5,skipped_steps\n";
  for (const auto& e : epochs) {
    csv << e.epoch << "," << e.seconds << "," << e.train_seconds << "," << e.train_images_per_s
        << "," << e.images << "," << e.steps << "," << e.train_loss << "," << e.test_loss << ","
        << e.test_accuracy << "," << e.test_accuracy_top5 << "," << e.skipped_steps << "\n";
  }
  write_file_atomically(path, csv.str());
}

// The lines of an earlier metrics.jsonl that a run resumed after `last_epoch` epochs and
// `last_step` steps keeps: epoch lines up to that epoch, step lines up to that step. A line
// cut short by a killed run, or one that is not ours, is dropped.
std::string lines_up_to(const std::string& path, int last_epoch, std::int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("epoch") || !j["epoch"].is_number_integer()) continue;
    const bool step_line = j.contains("type") && j["type"] == "step";
    if (step_line) {
      if (!j.contains("step") || !j["step"].is_number_integer()) continue;
      if (j["step"].get<std::int64_t>() > last_step) continue;
    } else if (j["epoch"].get<int>() > last_epoch) {
      continue;
    }
    kept += line + "\n";
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir, const std::vector<EpochRecord>& resumed,
                       std::int64_t resumed_step)
    : dir_(output_dir), epochs_(resumed) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  PARTRAIN_CHECK(!ec, UsageError, "cannot create the output directory ", dir_, ": ", ec.message());
  const std::string jsonl = dir_ + "/metrics.jsonl";
  const bool fresh = resumed.empty() && resumed_step == 0;
  write_file_atomically(
      jsonl, fresh ? std::string()
                   : lines_up_to(jsonl, resumed.empty() ? 0 : resumed.back().epoch, resumed_step));
  if (!resumed.empty()) write_csv(dir_ + "/metrics.csv", epochs_);
  jsonl_.open(jsonl, std::ios::app);
  PARTRAIN_CHECK(jsonl_.good(), UsageError, "cannot write ", jsonl);
}

void MetricsLog::log_step(int epoch, std::int64_t step, double loss, double images_per_s,
                          double lr) {
  jsonl_ << Json{{"type", "step"},
                 {"epoch", epoch},
                 {"step", step},
                 {"loss", loss},
                 {"images_per_s", images_per_s},
                 {"lr", lr}}
                .dump()
         << "\n";
  jsonl_.flush();
}

void MetricsLog::log_epoch(const EpochRecord& record, const std::vector<Breakdown>& breakdown) {
  Json line = epoch_to_json(record);
  line["type"] = "epoch";
  if (!breakdown.empty()) {
    Json ranks = Json::array();
    for (const Breakdown& b : breakdown) ranks.push_back(breakdown_to_json(b));
    line["breakdown"] = ranks;
  }
  jsonl_ << line.dump() << "\n";
  jsonl_.flush();
  PARTRAIN_CHECK(jsonl_.good(), UsageError, "writing ", dir_, "/metrics.jsonl failed (disk full?)");
  epochs_.push_back(record);
  write_csv(dir_ + "/metrics.csv", epochs_);
}

}  // namespace partrain
