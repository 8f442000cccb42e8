// defines: read_cifar100_bin() and write_cifar100_bin() — the official CIFAR-100 binary
// format: records of 1 coarse label byte, 1 fine label byte, 3072 pixel bytes (32x32 R
// plane, then G, then B).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"

namespace partrain::data {

inline constexpr std::int64_t kCifarImageBytes = 3 * 32 * 32;
inline constexpr std::int64_t kCifarRecordBytes = 2 + kCifarImageBytes;
inline constexpr int kCifar100Classes = 100;
inline constexpr int kCifar100CoarseClasses = 20;

// Reads at most `limit` records (0 = all) of `path`. The file size must be a positive whole
// number of records; labels out of range are reported with their byte offset. The returned
// dataset carries CIFAR-100's training-set mean and std.
ImageDataset read_cifar100_bin(const std::string& path, std::int64_t limit = 0);

// Writes `dataset` (3x32x32, fine labels < 100) to `path` via a temp file and a rename. The
// coarse label byte is fine / 5 (CIFAR-100 groups its 100 classes into 20 superclasses).
void write_cifar100_bin(const ImageDataset& dataset, const std::string& path);

}  // namespace partrain::data
