#include "trainer/train/run_report.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm_backends/errors.h"
#include "trainer/data/atomic_file.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

Json optional_number(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

Json epoch_json(const EpochRecord& e) {
  return Json{{"epoch", e.epoch},
              {"seconds", e.seconds},
              {"train_seconds", e.train_seconds},
              {"train_images_per_s", e.train_images_per_s},
              {"images", e.images},
              {"steps", e.steps},
              {"train_loss", e.train_loss},
              {"test_loss", e.test_loss},
              {"test_accuracy", e.test_accuracy}};
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir) : dir_(output_dir) {
  std::filesystem::create_directories(dir_);
  jsonl_.open(dir_ + "/metrics.jsonl", std::ios::app);
  if (!jsonl_) throw UsageError("cannot write " + dir_ + "/metrics.jsonl");
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

void MetricsLog::log_epoch(const EpochRecord& record) {
  Json line = epoch_json(record);
  line["type"] = "epoch";
  jsonl_ << line.dump() << "\n";
  jsonl_.flush();
  epochs_.push_back(record);
  std::ostringstream csv;
  csv << "epoch,seconds,train_seconds,train_images_per_s,images,steps,train_loss,test_loss,test_"
         "accuracy\n";
  for (const auto& e : epochs_) {
    csv << e.epoch << "," << e.seconds << "," << e.train_seconds << "," << e.train_images_per_s
        << "," << e.images << "," << e.steps << "," << e.train_loss << "," << e.test_loss << ","
        << e.test_accuracy << "\n";
  }
  data::write_file_atomically(dir_ + "/metrics.csv", csv.str());
}

void write_report(const std::string& output_dir, const RunSummary& s) {
  Json report;
  report["schema"] = "partrain.report/1";
  report["config"] = Json::parse(s.config_json);
  report["env"] = {{"os", s.env.os},
                   {"libtorch", s.env.libtorch},
                   {"backend", s.env.backend},
                   {"world_size", s.env.world_size},
                   {"strategy", s.env.strategy},
                   {"devices", s.env.devices},
                   {"cuda", s.env.cuda ? Json(*s.env.cuda) : Json(nullptr)}};
  Json epochs = Json::array();
  for (const auto& e : s.epochs) epochs.push_back(epoch_json(e));
  report["epochs"] = epochs;
  report["total_seconds"] = s.total_seconds;
  report["images_per_s"] = s.images_per_s;
  Json ranks = Json::array();
  for (const auto& r : s.ranks) {
    ranks.push_back(Json{{"rank", r.rank},
                         {"device", r.device},
                         {"peak_rss_mb", r.peak_rss_mb},
                         {"cuda_peak_allocated_mb", optional_number(r.cuda_peak_allocated_mb)},
                         {"cuda_peak_reserved_mb", optional_number(r.cuda_peak_reserved_mb)},
                         {"cuda_driver_used_mb", optional_number(r.cuda_driver_used_mb)},
                         {"compute_seconds", r.compute_seconds},
                         {"comm_wait_seconds", r.comm_wait_seconds},
                         {"comm_busy_seconds", r.comm_busy_seconds}});
  }
  report["ranks"] = ranks;
  if (!s.epochs.empty()) {
    report["final"] = {{"test_accuracy", s.epochs.back().test_accuracy},
                       {"test_loss", s.epochs.back().test_loss}};
  } else {
    report["final"] = {{"test_accuracy", nullptr}, {"test_loss", nullptr}};
  }
  std::filesystem::create_directories(output_dir);
  data::write_file_atomically(output_dir + "/report.json", report.dump(2) + "\n");
}

}  // namespace partrain
