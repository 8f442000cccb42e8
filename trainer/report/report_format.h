// defines: the report.json format, in one place — kReportSchema, the records a run reports
// (EpochRecord, Breakdown, RankRecord, Straggler, RunEnv, CompressionRecord, BalanceRecord,
// RunSummary) and,
// for each, the pair of
// functions that write it as JSON and read it back (epoch_to_json/epoch_from_json, rank_...,
// env_..., report_...); JsonAt, a value of a parsed document with its JSON path; os_name().
// LibTorch-free.
//
// The writer (report_writer.h), the reader (report_reader.h), metrics.jsonl, the checkpoints'
// epoch list and the tests' synthetic reports all go through these functions, so a field named
// here is named the same everywhere. Losses and accuracies may be NaN (a run that diverged):
// JSON has no NaN, so they are written as null and read back as NaN.
#pragma once

#include <cstdint>
#include <array>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

inline constexpr std::string_view kReportSchema = "partrain.report/1";

// A value inside a parsed JSON document and the path that leads to it ("ranks[1].device").
// Whatever is missing or ill-typed is a UsageError "DOCUMENT: PATH: what is wrong", because a
// document is often written by another program (or another version) and the user has to find
// what it got wrong. It refers to the document: keep that alive while a JsonAt is in use.
class JsonAt {
 public:
  JsonAt(const nlohmann::ordered_json& value, std::string document, std::string path = "");

  JsonAt operator[](const char* key) const;  // a member of an object; missing: an error
  JsonAt at(std::size_t index) const;        // an element of an array; missing: an error
  bool has(const char* key) const;           // an object with that member
  std::size_t size() const;                  // of an array; anything else: an error
  JsonAt object() const;                     // itself, checked to be an object

  double number() const;
  double non_negative() const;
  double number_or_nan() const;  // null (how NaN is written) reads as NaN
  std::optional<double> number_or_null() const;
  int integer() const;
  std::int64_t count() const;  // an integer, not negative
  std::string string() const;
  bool boolean() const;
  std::optional<std::string> string_or_null() const;
  std::vector<std::string> strings() const;  // an array of strings

  const nlohmann::ordered_json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what) const;

  // "an integer", "a string", "null", ... for "expected X, found Y".
  static std::string type_of(const nlohmann::ordered_json& value);

 private:
  const nlohmann::ordered_json* value_;
  std::string document_;
  std::string path_;
};

struct EpochRecord {
  int epoch = 0;
  double seconds = 0;        // wall time of the epoch: training plus evaluation
  double train_seconds = 0;  // training part only; images/s is measured on it
  double train_images_per_s = 0;
  std::int64_t images = 0;  // training images, all ranks
  std::int64_t steps = 0;   // optimizer steps taken so far
  double train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double test_accuracy_top5 = 0;
  std::int64_t skipped_steps = 0;  // f16: steps so far skipped for gradients that overflowed
};

// Where one rank's training time went, in seconds. The parts are disjoint intervals of the
// rank's wall time from its first epoch to its last checkpoint; `other` is that time minus the
// rest (logging, the epoch's sums, clock reads), so the parts add up to total(). comm_exposed
// is the wait in finish_backward for the gradient allreduce that backward did not hide.
struct Breakdown {
  double data_wait = 0;  // the loader's next batch and its copy to the device
  double forward = 0;    // forward and loss
  double backward = 0;
  double comm_exposed = 0;
  double optimizer = 0;   // unscale, clip, step, zero_grad
  double evaluation = 0;  // BatchNorm sharing, the test set, the epoch's sums
  double checkpoint = 0;
  double other = 0;
  double total() const;
};

// The parts by their JSON names, in the order report.json lists them.
inline constexpr std::array<std::pair<std::string_view, double Breakdown::*>, 8> kBreakdownParts{{
    {"data_wait", &Breakdown::data_wait},
    {"forward", &Breakdown::forward},
    {"backward", &Breakdown::backward},
    {"comm_exposed", &Breakdown::comm_exposed},
    {"optimizer", &Breakdown::optimizer},
    {"evaluation", &Breakdown::evaluation},
    {"checkpoint", &Breakdown::checkpoint},
    {"other", &Breakdown::other},
}};

// Where a rank's peak resident memory went (report.json's ranks[].memory), in MiB, each part
// measured where it is held (trainer/loop/memory_account.h says how): the process before the run
// made anything (the executable, LibTorch and their threads), what loading the dataset added,
// the parameters, the gradients with the Reducer's buckets, the optimizer's state, the
// communication buffers, the most that one step's forward and backward allocated above what
// was alive when it began (activations and autograd's temporaries), and what is left of
// peak_rss_mb: allocator caches and fragmentation, evaluation, checkpoint writes, the rest.
struct MemoryBreakdown {
  double floor = 0;
  double data = 0;
  double parameters = 0;
  double gradients = 0;
  double optimizer_state = 0;
  double communication = 0;
  double activations = 0;
  double unexplained = 0;  // may be below 0 when parts' peaks never coincided
};

inline constexpr std::array<std::pair<std::string_view, double MemoryBreakdown::*>, 8> kMemoryParts{
    {
        {"floor_mb", &MemoryBreakdown::floor},
        {"data_mb", &MemoryBreakdown::data},
        {"parameters_mb", &MemoryBreakdown::parameters},
        {"gradients_mb", &MemoryBreakdown::gradients},
        {"optimizer_state_mb", &MemoryBreakdown::optimizer_state},
        {"communication_mb", &MemoryBreakdown::communication},
        {"activations_mb", &MemoryBreakdown::activations},
        {"unexplained_mb", &MemoryBreakdown::unexplained},
    }};

struct RankRecord {
  int rank = 0;
  std::string device;
  double peak_rss_mb = 0;
  std::optional<double> cuda_peak_allocated_mb;
  std::optional<double> cuda_peak_reserved_mb;
  std::optional<double> cuda_driver_used_mb;  // what the driver reports for the device
  double compute_seconds = 0;
  double comm_wait_seconds = 0;
  double comm_busy_seconds = 0;
  // Bytes handed to the gradient collectives (with PowerSGD: the factors) in comm_busy_seconds,
  // over comm_buckets bucket collectives. Absent (reports written before them): 0.
  std::int64_t comm_bytes = 0;
  std::int64_t comm_buckets = 0;
  // Where it ran: its intra-op threads, the cores its host offers, and how many ranks of the
  // run shared that host (what makes a speed-up ideal on CPU, and contention). Absent (reports
  // written before them): 0.
  int threads = 0;
  int host_cores = 0;
  int ranks_on_host = 0;
  std::optional<Breakdown> breakdown;     // absent in reports written before it existed
  std::optional<MemoryBreakdown> memory;  // absent in reports written before it existed
};

// The rank whose lateness cost the others the most time at the steps' first gradient
// allreduce, when that cost matters (see straggler.h for the rule). seconds_cost: over the
// steps it was last, how much later it arrived than the rank before it, i.e. the wall time
// the run lost waiting for it. kind: "slow" (later at every step) or "away" (gone for whole
// steps: most of its cost came from steps it was later than a median step takes).
struct Straggler {
  int rank = 0;
  std::int64_t steps_last = 0;
  std::int64_t steps = 0;  // steps with an arrival from every rank
  double seconds_cost = 0;
  std::string kind = "slow";
  std::int64_t steps_away = 0;     // steps it was late by more than median_step_seconds
  double median_step_seconds = 0;  // between two steps' first arrivals; 0: not measured
};

std::string os_name();  // "linux", "windows", "macos": what this binary was built for

struct RunEnv {
  std::string os = os_name();
  std::string libtorch;
  std::string backend;  // "none" for a single process
  int world_size = 1;
  std::string strategy;
  std::vector<std::string> devices;
  std::optional<std::string> cuda;
};

// How the gradients travelled, with comm.compression powersgd: the bytes each rank hands to
// the allreduces of one optimizer step once compressing (after start_step), and what the plain
// allreduce hands over for the same gradients. Elements of the gradients' dtype; the wire
// dtype (comm.wire_dtype) then narrows both alike.
struct CompressionRecord {
  std::string method;  // "powersgd"
  int rank = 0;
  std::int64_t start_step = 0;
  std::int64_t compressed_matrices = 0;
  std::int64_t bytes_per_step = 0;
  std::int64_t uncompressed_bytes_per_step = 0;
};

nlohmann::ordered_json compression_to_json(const CompressionRecord& record);
CompressionRecord compression_from_json(const JsonAt& j);

// How each micro-step was split over the ranks in global-batch mode (data.balance). mode: even,
// weights or auto; shares: the split at the end of the run, in rank order; changes: auto's moves,
// each with the figures it was decided on (empty for even and weights).
struct BalanceChangeRecord {
  std::int64_t step = 0;  // optimizer steps taken when the split moved
  std::vector<std::int64_t> shares;
  std::vector<double> seconds_per_sample;  // each rank's busy time per sample measured
  std::vector<double> running;  // the fraction of the time each ran (absent in older reports: 1)
  double predicted_before = 0;  // a step's seconds (busiest rank), old split
  double predicted_after = 0;   // and with the new one
  // Measured on rank 0: the median seconds of a step over the window decided on, under the
  // split left (absent in older reports: 0, not measured).
  double step_seconds = 0;
  // A move taken back: the steps under it (step_seconds) were no faster than before it
  // (before_move_seconds). Absent in older reports: false.
  bool undo = false;
  double before_move_seconds = 0;
};
struct BalanceRecord {
  std::string mode;
  std::vector<std::int64_t> shares;
  std::vector<BalanceChangeRecord> changes;
};

nlohmann::ordered_json balance_to_json(const BalanceRecord& record);
BalanceRecord balance_from_json(const JsonAt& j);

// What report.json holds. Its "final" object is not a field: it repeats the last epoch's
// figures (null without epochs) for readers that want only those.
// Rank 0's start-up, in seconds: joining the run (store, host layout, communicators), the
// clock estimate, loading the data, and the model (build, rank 0's state broadcast, the
// optimizer, a resume, the Reducer). What explain's start-up part is made of; the rest of that
// part is the end of the run (the final sums and the report).
struct StartupRecord {
  double join = 0;
  double clocks = 0;
  double data = 0;
  double model = 0;
  double total() const { return join + clocks + data + model; }
};

struct RunSummary {
  std::string config_json;  // the resolved config (config_to_json), embedded as an object
  RunEnv env;
  std::vector<EpochRecord> epochs;
  double total_seconds = 0;
  double images_per_s = 0;
  std::vector<RankRecord> ranks;
  // Without compression: absent from the file (and from reports written before it).
  std::optional<CompressionRecord> compression;
  std::optional<Straggler> straggler;  // null: the ranks were even, or one rank only
  // Global-batch mode only: absent from the file otherwise (and from reports written before it).
  std::optional<BalanceRecord> balance;
  std::optional<StartupRecord> startup;  // absent in reports written before it
};

// The epoch's entry of report.json's "epochs", of the checkpoint's metadata and of an epoch
// line of metrics.jsonl. test_accuracy_top5 and skipped_steps came later than the rest: absent
// (checkpoints and reports written before them), they read as 0.
nlohmann::ordered_json epoch_to_json(const EpochRecord& record);
EpochRecord epoch_from_json(const JsonAt& j);
EpochRecord epoch_from_json(const nlohmann::json& j);  // errors name "epoch record"

// {"data_wait": s, ..., "other": s, "total": s}; "total" is derived, so only written.
nlohmann::ordered_json breakdown_to_json(const Breakdown& breakdown);
Breakdown breakdown_from_json(const JsonAt& j);

nlohmann::ordered_json straggler_to_json(const std::optional<Straggler>& straggler);
std::optional<Straggler> straggler_from_json(const JsonAt& j);

// "breakdown" came later than the rest: absent, it reads as nullopt.
nlohmann::ordered_json rank_to_json(const RankRecord& record);
RankRecord rank_from_json(const JsonAt& j);

nlohmann::ordered_json env_to_json(const RunEnv& env);
RunEnv env_from_json(const JsonAt& j);

// The whole document, "schema" first; report_from_json() refuses any other schema. A report
// without "straggler" (written before it existed) reads as null.
nlohmann::ordered_json report_to_json(const RunSummary& summary);
RunSummary report_from_json(const JsonAt& j);

}  // namespace partrain
