// Config -> text: the resolved config as JSON (report.json) and as YAML (`partrain validate`).
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "trainer/config/config.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

// The keys of the chosen optimizer and schedule only: the resolved config reads back as it
// was meant (a key of another optimizer would be refused).
Json optimizer_json(const OptimizerConfig& o) {
  Json j = {{"name", name_of(o.name)}, {"lr", o.lr}, {"weight_decay", o.weight_decay}};
  if (o.name == OptimizerName::kSgd) {
    j["momentum"] = o.momentum;
    j["nesterov"] = o.nesterov;
  } else {
    j["betas"] = {o.beta1, o.beta2};
    j["eps"] = o.eps;
  }
  return j;
}

Json schedule_json(const ScheduleConfig& s) {
  Json j = {{"name", name_of(s.name)}, {"warmup_steps", s.warmup_steps}};
  if (s.name == ScheduleName::kStep) {
    j["step_size"] = s.step_size;
    j["gamma"] = s.gamma;
  }
  if (s.name == ScheduleName::kCosine) j["min_lr"] = s.min_lr;
  return j;
}

// JSON and YAML share their data model for everything a config holds, so the YAML form is
// made from the JSON one: one list of keys to keep in step with the readers, not two.
void emit_json(YAML::Emitter& out, const Json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_json(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& v : j) emit_json(out, v);
    out << YAML::EndSeq;
  } else if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<long long>();
  } else if (j.is_number_unsigned()) {
    out << j.get<unsigned long long>();
  } else if (j.is_number_float()) {
    out << j.get<double>();
  } else {
    out << j.get<std::string>();
  }
}

// A list that is empty when unset, or a string that is: null, which reads back as absent.
template <typename Value>
Json or_null(const Value& value) {
  return value.empty() ? Json(nullptr) : Json(value);
}

// auto, the list of counts, or the count, as the key is written.
Json nproc_per_node_json(const NodeLayout& nodes) {
  if (nodes.is_auto()) return "auto";
  if (nodes.is_per_node()) return nodes.counts();
  return nodes.count();
}

Json launch_json(const LaunchConfig& l) {
  return {{"nproc_per_node", nproc_per_node_json(l.nproc_per_node)},
          {"nnodes", l.nnodes},
          {"rendezvous", l.rendezvous},
          {"max_restarts", l.max_restarts},
          {"bind", name_of(l.bind)}};
}

// PowerSGD's keys are null (absent) without it, as the reader refuses them there.
Json comm_json(const CommConfig& m) {
  const bool powersgd = m.compression == Compression::kPowerSgd;
  return {{"backend", m.backend},
          {"bucket_mb", m.bucket_mb},
          {"wire_dtype", comm::dtype_name(m.wire_dtype)},
          {"algorithm", m.algorithm},
          {"tcp_congestion", m.tcp_congestion},
          {"shm_single_copy", m.shm_single_copy},
          {"timeout_s", m.timeout_s},
          {"interface", m.interface},
          {"host", m.host},
          {"compression", name_of(m.compression)},
          {"powersgd_rank", powersgd ? Json(m.powersgd_rank) : Json(nullptr)},
          {"powersgd_start_step", powersgd ? Json(m.powersgd_start_step) : Json(nullptr)}};
}

// Global-batch mode: batch_size is the rank's share once resolved (null before, so that the
// config loads again), beside the global batch.
Json data_json(const DataConfig& d) {
  const Json batch = d.batch_size > 0 ? Json(d.batch_size) : Json(nullptr);
  const Json global = d.global_batch_size > 0 ? Json(d.global_batch_size) : Json(nullptr);
  return {{"dataset", name_of(d.dataset)},
          {"root", d.root},
          {"download", d.download},
          {"url", d.url},
          {"batch_size", batch},
          {"global_batch_size", global},
          {"balance",
           d.balance == BalanceMode::kWeights ? Json(d.balance_weights) : Json(name_of(d.balance))},
          {"num_workers", d.num_workers},
          {"augment", d.augment},
          {"train_limit", d.train_limit},
          {"test_limit", d.test_limit},
          {"synthetic_train", d.synthetic_train},
          {"synthetic_test", d.synthetic_test},
          {"image_size", d.image_size},
          {"mean", or_null(d.mean)},
          {"std", or_null(d.std)}};
}

// With a TorchScript model the built-in model's keys mean nothing: null, which reads back as
// absent, so the resolved config loads again.
Json model_json(const ModelConfig& m) {
  const bool builtin = m.torchscript.empty();
  auto builtin_only = [builtin](const Json& v) { return builtin ? v : Json(nullptr); };
  return {{"name", builtin_only(name_of(m.name))},
          {"width", builtin_only(m.width)},
          {"norm", builtin_only(name_of(m.norm))},
          {"torchscript", or_null(m.torchscript)},
          {"sync_batchnorm", m.sync_batchnorm}};
}

Json train_json(const TrainConfig& t) {
  return {{"epochs", t.epochs},
          {"max_steps", t.max_steps},
          {"accumulate_steps", t.accumulate_steps},
          {"optimizer", optimizer_json(t.optimizer)},
          {"schedule", schedule_json(t.schedule)},
          {"label_smoothing", t.label_smoothing},
          {"clip_grad_norm", t.clip_grad_norm},
          {"precision", name_of(t.precision)},
          {"threads", t.threads},
          {"log_every", t.log_every},
          {"shard", name_of(t.shard)}};
}

// auto | never | the path: as the key is written.
std::string resume_text(const ResumeFrom& resume) {
  switch (resume.mode) {
    case ResumeMode::kAuto:
      return "auto";
    case ResumeMode::kNever:
      return "never";
    case ResumeMode::kPath:
      return resume.path;
  }
  return resume.path;
}

}  // namespace

std::string config_to_json(const Config& c) {
  Json j;
  j["name"] = c.name;
  j["seed"] = c.seed;
  j["device"] = name_of(c.device);
  j["strategy"] = name_of(c.strategy);
  j["launch"] = launch_json(c.launch);
  j["comm"] = comm_json(c.comm);
  j["data"] = data_json(c.data);
  j["model"] = model_json(c.model);
  j["train"] = train_json(c.train);
  j["checkpoint"] = {{"every_epochs", c.checkpoint.every_epochs},
                     {"every_steps", c.checkpoint.every_steps},
                     {"every_seconds", c.checkpoint.every_seconds},
                     {"keep", c.checkpoint.keep},
                     {"resume", resume_text(c.checkpoint.resume)}};
  j["observe"] = {{"trace", c.observe.trace},
                  {"trace_steps", {c.observe.trace_first_step, c.observe.trace_last_step}},
                  {"tensorboard", c.observe.tensorboard}};
  j["output"] = {{"dir", c.output_dir}};
  j["reference"] = or_null(c.reference);
  return j.dump();
}

std::string config_to_yaml(const Config& config) {
  YAML::Emitter out;
  emit_json(out, Json::parse(config_to_json(config)));
  return std::string(out.c_str()) + "\n";
}

}  // namespace partrain
