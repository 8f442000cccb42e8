// defines: read_idx_dataset() — MNIST-style IDX image and label files, plain or gzipped
// (Fashion-MNIST), read with zlib.
//
// IDX: a 4-byte magic (0, 0, type 0x08 = unsigned byte, number of dimensions), then each
// dimension as a big-endian uint32, then the data. Images are magic 2051 (3 dims: count,
// rows, cols), labels 2049 (1 dim: count).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"

namespace partrain::data {

inline constexpr std::uint32_t kIdxImagesMagic = 2051;
inline constexpr std::uint32_t kIdxLabelsMagic = 2049;

// Reads at most `limit` samples (0 = all) of an image file and its label file into a
// 1-channel dataset with `num_classes` classes. Every check happens before the data is
// allocated: magic, dimensions, and that the file can hold what the header announces.
ImageDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              int num_classes, std::int64_t limit = 0);

}  // namespace partrain::data
