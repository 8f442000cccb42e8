// defines: the closed sets of names a config chooses from — DeviceChoice, StrategyKind,
// Precision, DatasetKind, ModelName, Norm, OptimizerName, ScheduleName, Compression,
// BalanceMode, Shard, CpuBinding — each with
// the table of its YAML names, and name_of() to write one back.
//
// The reader turns each name into its enumerator once (config_reader.cpp), so the rest of
// partrain compares enumerators: a misspelt name fails to compile instead of never matching.
// LibTorch-free and header-only, so that LibTorch-free libraries (data readers) can use it
// without linking the config reader.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace partrain {

enum class DeviceChoice : std::uint8_t { kAuto, kCpu, kCuda };
enum class StrategyKind : std::uint8_t { kSingle, kDdp, kDp };
enum class Precision : std::uint8_t { kF32, kBf16, kF16 };
enum class DatasetKind : std::uint8_t {
  kCifar100,
  kCifar10,
  kFashionMnist,
  kMnist,
  kImageFolder,
  kTensors,
  kSynthetic
};
enum class ModelName : std::uint8_t { kDigitalNet, kResnet18, kMlp };
enum class Norm : std::uint8_t { kBatch, kNone };
enum class OptimizerName : std::uint8_t { kSgd, kAdamW };
enum class ScheduleName : std::uint8_t { kConstant, kStep, kCosine };
enum class Compression : std::uint8_t { kNone, kPowerSgd };
// train.shard: what each rank of strategy ddp keeps only its slice of (ZeRO's stages 1 and 2).
enum class Shard : std::uint8_t { kNone, kOptimizer, kGradients };
// data.balance: even, auto, or a list of weights (written "weights" where a name is needed).
enum class BalanceMode : std::uint8_t { kEven, kAuto, kWeights };
// launch.bind: whether the ranks `partrain run` starts on a host are bound to CPUs.
enum class CpuBinding : std::uint8_t { kAuto, kNone };

template <typename Enum>
struct EnumName {
  Enum value;
  std::string_view name;
};

// Each enum's names, in the order an error lists them ("'x' is not one of cuda | cpu | auto").
inline constexpr EnumName<DeviceChoice> kDeviceChoiceNames[] = {
    {DeviceChoice::kCuda, "cuda"}, {DeviceChoice::kCpu, "cpu"}, {DeviceChoice::kAuto, "auto"}};
inline constexpr EnumName<StrategyKind> kStrategyKindNames[] = {
    {StrategyKind::kDdp, "ddp"}, {StrategyKind::kDp, "dp"}, {StrategyKind::kSingle, "single"}};
inline constexpr EnumName<Precision> kPrecisionNames[] = {
    {Precision::kF32, "f32"}, {Precision::kBf16, "bf16"}, {Precision::kF16, "f16"}};
inline constexpr EnumName<DatasetKind> kDatasetKindNames[] = {
    {DatasetKind::kCifar100, "cifar100"},          {DatasetKind::kCifar10, "cifar10"},
    {DatasetKind::kFashionMnist, "fashion-mnist"}, {DatasetKind::kMnist, "mnist"},
    {DatasetKind::kImageFolder, "image-folder"},   {DatasetKind::kTensors, "tensors"},
    {DatasetKind::kSynthetic, "synthetic"}};
inline constexpr EnumName<ModelName> kModelNameNames[] = {{ModelName::kDigitalNet, "digitalnet"},
                                                          {ModelName::kResnet18, "resnet18"},
                                                          {ModelName::kMlp, "mlp"}};
inline constexpr EnumName<Norm> kNormNames[] = {{Norm::kBatch, "batch"}, {Norm::kNone, "none"}};
inline constexpr EnumName<OptimizerName> kOptimizerNameNames[] = {{OptimizerName::kSgd, "sgd"},
                                                                  {OptimizerName::kAdamW, "adamw"}};
inline constexpr EnumName<ScheduleName> kScheduleNameNames[] = {
    {ScheduleName::kConstant, "constant"},
    {ScheduleName::kStep, "step"},
    {ScheduleName::kCosine, "cosine"}};
inline constexpr EnumName<Compression> kCompressionNames[] = {{Compression::kNone, "none"},
                                                              {Compression::kPowerSgd, "powersgd"}};
inline constexpr EnumName<Shard> kShardNames[] = {
    {Shard::kNone, "none"}, {Shard::kOptimizer, "optimizer"}, {Shard::kGradients, "gradients"}};
inline constexpr EnumName<BalanceMode> kBalanceModeNames[] = {
    {BalanceMode::kEven, "even"}, {BalanceMode::kAuto, "auto"}, {BalanceMode::kWeights, "weights"}};
inline constexpr EnumName<CpuBinding> kCpuBindingNames[] = {{CpuBinding::kAuto, "auto"},
                                                            {CpuBinding::kNone, "none"}};

// The table of an enum, picked by the type of the argument (its value is not used).
constexpr std::span<const EnumName<DeviceChoice>> names_of(DeviceChoice) {
  return kDeviceChoiceNames;
}
constexpr std::span<const EnumName<StrategyKind>> names_of(StrategyKind) {
  return kStrategyKindNames;
}
constexpr std::span<const EnumName<Precision>> names_of(Precision) { return kPrecisionNames; }
constexpr std::span<const EnumName<DatasetKind>> names_of(DatasetKind) { return kDatasetKindNames; }
constexpr std::span<const EnumName<ModelName>> names_of(ModelName) { return kModelNameNames; }
constexpr std::span<const EnumName<Norm>> names_of(Norm) { return kNormNames; }
constexpr std::span<const EnumName<OptimizerName>> names_of(OptimizerName) {
  return kOptimizerNameNames;
}
constexpr std::span<const EnumName<ScheduleName>> names_of(ScheduleName) {
  return kScheduleNameNames;
}
constexpr std::span<const EnumName<Compression>> names_of(Compression) { return kCompressionNames; }
constexpr std::span<const EnumName<BalanceMode>> names_of(BalanceMode) { return kBalanceModeNames; }
constexpr std::span<const EnumName<Shard>> names_of(Shard) { return kShardNames; }
constexpr std::span<const EnumName<CpuBinding>> names_of(CpuBinding) { return kCpuBindingNames; }

// The YAML name of `value`: what the resolved config, report.json and messages print. Every
// enumerator has one (the config tests read each name back).
template <typename Enum>
requires requires(Enum e) { names_of(e); }
constexpr std::string_view name_of(Enum value) {
  for (const EnumName<Enum>& entry : names_of(value)) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

}  // namespace partrain
