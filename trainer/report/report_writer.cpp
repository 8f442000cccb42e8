#include "trainer/report/report_writer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"

namespace partrain {

void write_report(const std::string& output_dir, const RunSummary& summary) {
  std::filesystem::create_directories(output_dir);
  write_file_atomically(output_dir + "/report.json", report_to_json(summary).dump(2) + "\n");
}

}  // namespace partrain
