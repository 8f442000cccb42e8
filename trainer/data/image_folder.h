// defines: list_image_classes(), read_image_folder() and kMaxImagePixels — torchvision's
// ImageFolder layout (ROOT/<class>/<image>), decoded (JPEG: libjpeg-turbo, PNG: libpng, others:
// OpenCV), optionally resized and centre-cropped (OpenCV).
//
// The image libraries' headers stay in image_folder.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/dataset.h"

namespace partrain::data {

// The most pixels an image may have (8192 x 8192), checked against what its header announces
// before it is decoded: a header may announce far more pixels than its file holds, and a small
// file can decode to far more bytes than it has (a 10 KB WebP to 768 MB).
inline constexpr std::uint64_t kMaxImagePixels = 1ull << 26;

struct ImageFolderOptions {
  // Class names in label order; empty: the sorted sub-folder names of the folder itself
  // (what the training split does). The validation split passes the training split's list,
  // so its labels mean the same; a sub-folder missing from that list is an error.
  std::vector<std::string> classes;
  // Shorter side resized to image_size, then the centre image_size x image_size square cut
  // out (torchvision's Resize(image_size) + CenterCrop(image_size)). 0: images are kept as
  // they are and must all have one size.
  int image_size = 0;
  int threads = 0;         // decoding threads; 0: the hardware's concurrency
  std::int64_t limit = 0;  // keep the first N images (class by class, names sorted); 0 = all
};

// The sorted names of the sub-folders of `dir` (the classes). Throws UsageError when `dir` is
// missing or has no sub-folder.
std::vector<std::string> list_image_classes(const std::string& dir);

// Reads every image file (.jpg .jpeg .png .bmp .ppm .pgm .pbm .tif .tiff .webp, any case) of
// dir/<class>/ as 8-bit RGB, planar. Other files are skipped. A class folder without images,
// a file that is damaged or cannot be decoded (named, with the decoder's reason), or images of
// different sizes with image_size 0 (both files named) throw UsageError. The dataset's mean and std
// are left empty: the caller knows whether to compute them or take the config's.
ImageDataset read_image_folder(const std::string& dir, const ImageFolderOptions& options);

}  // namespace partrain::data
