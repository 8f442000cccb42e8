// defines: read_cifar100_bin(), write_cifar100_bin() and read_cifar10_bin() — the official
// CIFAR binary formats: CIFAR-100 records of 1 coarse label byte, 1 fine label byte, 3072
// pixel bytes (32x32 R plane, then G, then B); CIFAR-10 records of 1 label byte and the same
// 3072 pixel bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/dataset.h"

namespace partrain::data {

inline constexpr std::int64_t kCifarImageBytes = 3 * 32 * 32;
inline constexpr std::int64_t kCifarRecordBytes = 2 + kCifarImageBytes;
inline constexpr int kCifar100Classes = 100;
inline constexpr int kCifar100CoarseClasses = 20;
inline constexpr int kCifar10Classes = 10;
inline constexpr std::int64_t kCifar10RecordBytes = 1 + kCifarImageBytes;

// Reads at most `limit` records (0 = all) of `path`. The file size must be a positive whole
// number of records; labels out of range are reported with their byte offset. The returned
// dataset carries CIFAR-100's training-set mean and std.
ImageDataset read_cifar100_bin(const std::string& path, std::int64_t limit = 0);

// Reads the records of `paths` in order (CIFAR-10's data_batch_1.bin .. data_batch_5.bin, or
// test_batch.bin), at most `limit` in all (0 = all), with the same checks as
// read_cifar100_bin. The returned dataset carries CIFAR-10's training-set mean and std.
ImageDataset read_cifar10_bin(const std::vector<std::string>& paths, std::int64_t limit = 0);

// Writes `dataset` (3x32x32, fine labels < 100) to `path` via a temp file and a rename. The
// coarse label byte is fine / 5 (CIFAR-100 groups its 100 classes into 20 superclasses).
void write_cifar100_bin(const ImageDataset& dataset, const std::string& path);

}  // namespace partrain::data
