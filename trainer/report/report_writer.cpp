#include "trainer/report/report_writer.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

Json optional_number(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace

Json epoch_to_json(const EpochRecord& e) {
  return Json{{"epoch", e.epoch},
              {"seconds", e.seconds},
              {"train_seconds", e.train_seconds},
              {"train_images_per_s", e.train_images_per_s},
              {"images", e.images},
              {"steps", e.steps},
              {"train_loss", e.train_loss},
              {"test_loss", e.test_loss},
              {"test_accuracy", e.test_accuracy},
              {"test_accuracy_top5", e.test_accuracy_top5},
              {"skipped_steps", e.skipped_steps}};
}

EpochRecord epoch_from_json(const nlohmann::json& j) {
  EpochRecord e;
  e.epoch = j.at("epoch").get<int>();
  e.seconds = j.at("seconds").get<double>();
  e.train_seconds = j.at("train_seconds").get<double>();
  e.train_images_per_s = j.at("train_images_per_s").get<double>();
  e.images = j.at("images").get<std::int64_t>();
  e.steps = j.at("steps").get<std::int64_t>();
  e.train_loss = j.at("train_loss").get<double>();
  e.test_loss = j.at("test_loss").get<double>();
  e.test_accuracy = j.at("test_accuracy").get<double>();
  // Absent from the records of checkpoints written before they existed.
  e.test_accuracy_top5 = j.value("test_accuracy_top5", 0.0);
  e.skipped_steps = j.value("skipped_steps", std::int64_t{0});
  return e;
}

void write_report(const std::string& output_dir, const RunSummary& s) {
  Json report;
  report["schema"] = "partrain.report/1";
  report["config"] = Json::parse(s.config_json);
  report["env"] = {{"os", os_name()},
                   {"libtorch", s.env.libtorch},
                   {"backend", s.env.backend},
                   {"world_size", s.env.world_size},
                   {"strategy", s.env.strategy},
                   {"devices", s.env.devices},
                   {"cuda", s.env.cuda ? Json(*s.env.cuda) : Json(nullptr)}};
  Json epochs = Json::array();
  for (const auto& e : s.epochs) epochs.push_back(epoch_to_json(e));
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
                       {"test_loss", s.epochs.back().test_loss},
                       {"test_accuracy_top5", s.epochs.back().test_accuracy_top5}};
  } else {
    report["final"] = {
        {"test_accuracy", nullptr}, {"test_loss", nullptr}, {"test_accuracy_top5", nullptr}};
  }
  std::filesystem::create_directories(output_dir);
  write_file_atomically(output_dir + "/report.json", report.dump(2) + "\n");
}

std::string os_name() {
#if defined(_WIN32)
  return "windows";
#elif defined(__APPLE__)
  return "macos";
#else
  return "linux";
#endif
}

}  // namespace partrain
