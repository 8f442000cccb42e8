// defines: read_tensor_file() — a data set saved from Python as
//   torch.save({"images": uint8 tensor [N, C, H, W], "labels": int64 tensor [N]}, path)
// with an optional "classes": a list of class names (their count fixes the label range).
//
// The reader needs LibTorch's unpickler, so it lives in partrain_loader; this header stays
// free of LibTorch, and load_dataset() reaches the reader through a TensorFileReader.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/data/dataset.h"

namespace partrain::data {

// Reads at most `limit` samples (0 = all). Without "classes", num_classes is the largest
// label + 1. A file that is not such a dict, a wrong dtype or shape, N that differ between
// images and labels, or a negative label or one outside "classes" throws UsageError naming the
// file and the key. mean and std are left empty (load_dataset computes or sets them).
ImageDataset read_tensor_file(const std::string& path, std::int64_t limit);

}  // namespace partrain::data
