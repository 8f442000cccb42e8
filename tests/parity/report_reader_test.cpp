// read_run_report(): a good report reads back its figures; bad JSON, a wrong schema, missing
// and ill-typed fields are UsageErrors naming the file and the JSON path.
#include "trainer/report/report_reader.h"

#include <gtest/gtest.h>

#include "common/errors.h"
#include "tests/parity/synthetic_reports.h"

namespace partrain::parity {
namespace {

using testing::RunSpec;
using testing::ScratchDir;
using testing::write_run_report;

class RunReportTest : public ::testing::Test {
 protected:
  void expect_error(const nlohmann::json& doc, const std::string& part) {
    expect_text_error(doc.dump(2), part);
  }
  void expect_text_error(const std::string& text, const std::string& part) {
    const std::string file = dir_.write("report.json", text);
    try {
      read_run_report(file);
      ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    } catch (const UsageError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(file + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
  nlohmann::json good() { return testing::report_json(dir_, testing::ddp_spec()); }
  ScratchDir dir_;
};

TEST_F(RunReportTest, ReadsTheFigures) {
  RunSpec spec = testing::ddp_spec();
  spec.epoch_seconds = {4.0, 6.0};
  spec.cuda_reserved_mb = std::vector<double>{700.0, 650.0};
  const RunReport r = read_run_report(write_run_report(dir_, "r", spec));
  EXPECT_EQ(r.strategy, "ddp");
  EXPECT_EQ(r.summary.env.strategy, "ddp");
  EXPECT_EQ(r.summary.env.world_size, 2);
  EXPECT_EQ(r.batch_size, 500);
  EXPECT_EQ(r.dataset, "cifar100");
  ASSERT_EQ(r.summary.epochs.size(), 2u);
  EXPECT_EQ(r.summary.epochs[1].seconds, 6.0);
  ASSERT_EQ(r.summary.ranks.size(), 2u);
  EXPECT_EQ(r.summary.ranks[1].peak_rss_mb, 380.0);
  EXPECT_EQ(*r.summary.ranks[1].cuda_peak_reserved_mb, 650.0);
  EXPECT_FALSE(r.summary.ranks[1].cuda_peak_allocated_mb);
  EXPECT_EQ(r.config_leaves.at("data.num_workers"), "0");
  EXPECT_EQ(r.config_leaves.at("model.name"), "digitalnet");
  EXPECT_EQ(r.summary.epochs.back().test_accuracy, 0.3);
}

TEST_F(RunReportTest, BadJsonNamesTheByte) {
  expect_text_error("{\"schema\": \"partrain.report/1\",\n \"config\": {,}}",
                    "not valid JSON at byte offset 44 (line 2, column 13)");
  expect_text_error("", "not valid JSON at byte offset 0");
}

TEST_F(RunReportTest, WrongSchema) {
  nlohmann::json doc = good();
  doc["schema"] = "partrain.bench/1";
  expect_error(doc, "schema: is \"partrain.bench/1\", expected \"partrain.report/1\"");
  doc.erase("schema");
  expect_error(doc, "schema: missing");
  expect_error(nlohmann::json::array(), "(top level): expected a JSON object, found an array");
}

TEST_F(RunReportTest, MissingFieldsNameTheirPath) {
  nlohmann::json doc = good();
  doc["ranks"][1].erase("peak_rss_mb");
  expect_error(doc, "ranks[1].peak_rss_mb: missing");

  doc = good();
  doc["config"]["data"].erase("num_workers");
  expect_error(doc, "config.data.num_workers: missing");

  doc = good();
  doc["env"].erase("world_size");
  expect_error(doc, "env.world_size: missing");

  doc = good();
  doc.erase("final");
  expect_error(doc, "final: missing");

  doc = good();
  doc["epochs"] = nlohmann::json::array();
  expect_error(doc, "epochs: is empty");
}

TEST_F(RunReportTest, IllTypedFieldsNameTheirPath) {
  nlohmann::json doc = good();
  doc["epochs"][0]["seconds"] = "12.3";
  expect_error(doc, "epochs[0].seconds: expected a number, found a string");

  doc = good();
  doc["ranks"][0]["cuda_peak_reserved_mb"] = true;
  expect_error(doc, "ranks[0].cuda_peak_reserved_mb: expected a number or null, found a boolean");

  doc = good();
  doc["config"]["data"]["batch_size"] = 2.5;
  expect_error(doc, "config.data.batch_size: expected an integer, found a number");

  doc = good();
  doc["env"]["devices"][1] = 3;
  expect_error(doc, "env.devices[1]: expected a string, found an integer");

  doc = good();
  doc["ranks"] = nlohmann::json::object();
  expect_error(doc, "ranks: expected an array, found an object");

  doc = good();
  doc["total_seconds"] = -1;
  expect_error(doc, "total_seconds: must not be negative");
}

}  // namespace
}  // namespace partrain::parity
