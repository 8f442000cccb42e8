// image-folder: class folders, labels, exact pixels of PNGs, the resize + centre-crop
// convention, JPEG decoding, statistics, and every broken folder and file it must name.
#include "trainer/data/image_folder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "tests/data/scratch_files.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"

namespace partrain::data {
namespace {

namespace fs = std::filesystem;
using test_files::usage_error_of;
using test_files::write_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;

// An 8-bit BGR image whose pixel (y, x) is (b, g, r) = (seed + x, seed + y, seed + x + y).
cv::Mat pattern(int width, int height, int seed) {
  cv::Mat image(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<std::uint8_t>(seed + x), static_cast<std::uint8_t>(seed + y),
                    static_cast<std::uint8_t>(seed + x + y));
    }
  }
  return image;
}

std::string write_image(const std::string& dir, const std::string& name, const cv::Mat& image) {
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / name).string();
  EXPECT_TRUE(cv::imwrite(path, image)) << path;
  return path;
}

DataConfig folder_config(const std::string& root) {
  DataConfig cfg;
  cfg.dataset = DatasetKind::kImageFolder;
  cfg.root = root;
  cfg.num_workers = 3;
  return cfg;
}

// train/{cat,ant}/ with 2 and 3 PNGs of 6x4 pixels; val/cat/ with one.
class ImageFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    // Names built by appending: GCC 12 warns (-Wrestrict, wrongly) of "a" + to_string() + ".png".
    const auto name = [](char letter, int i, const char* extension) {
      std::string out(1, letter);
      out += std::to_string(i);
      out += extension;
      return out;
    };
    for (int i = 0; i < 3; ++i)
      write_image(dir / "train/ant", name('a', i, ".png"), pattern(6, 4, 10 * i));
    for (int i = 0; i < 2; ++i)
      write_image(dir / "train/cat", name('c', i, ".PNG"), pattern(6, 4, 100 + i));
    write_image(dir / "val/cat", "v.png", pattern(6, 4, 200));
    write_bytes(dir / "train/cat/notes.txt", {'h', 'i'});  // not an image: skipped
  }
  ScratchDir dir;
};

TEST_F(ImageFolder, SortedClassesLabelsAndExactRgbPlanes) {
  const DatasetSplits splits = load_splits(folder_config(dir.path()), 0);
  const ImageDataset& train = splits.train;
  EXPECT_EQ(train.name, "image-folder");
  EXPECT_EQ(train.size, 5);
  EXPECT_EQ(train.num_classes, 2);
  EXPECT_EQ(train.channels, 3);
  EXPECT_EQ(train.height, 4);
  EXPECT_EQ(train.width, 6);
  EXPECT_EQ(train.labels, (std::vector<std::int64_t>{0, 0, 0, 1, 1}));  // ant < cat
  // Sample 3 is cat/c0.PNG, seed 100: R plane first (seed + x + y), then G, then B.
  const std::uint8_t* image = train.image(3);
  EXPECT_EQ(image[0 * 24 + 2 * 6 + 5], 100 + 5 + 2);  // R at (y 2, x 5)
  EXPECT_EQ(image[1 * 24 + 2 * 6 + 5], 100 + 2);      // G
  EXPECT_EQ(image[2 * 24 + 2 * 6 + 5], 100 + 5);      // B
  // val/ has only cat, which keeps the training split's label 1.
  EXPECT_EQ(splits.test.size, 1);
  EXPECT_EQ(splits.test.labels, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(splits.test.num_classes, 2);
  EXPECT_EQ(splits.test.image(0)[0], 200);
}

TEST_F(ImageFolder, OwnStatisticsComeFromTheTrainingSplitUnlessGiven) {
  const DataConfig cfg = folder_config(dir.path());
  const DatasetSplits splits = load_splits(cfg, 0);
  std::vector<float> mean, std;
  compute_channel_stats(splits.train, mean, std);
  EXPECT_EQ(splits.train.mean, mean);
  EXPECT_EQ(splits.train.std, std);
  EXPECT_EQ(splits.test.mean, mean);  // the test split is normalised like the training split
  EXPECT_EQ(splits.test.std, std);
  // B of every image is seed + x: over the 5 images the mean is known exactly.
  const double b_mean = ((0 + 10 + 20 + 100 + 101) / 5.0 + 2.5) / 255.0;
  EXPECT_NEAR(mean[2], b_mean, 1e-6);
  // load_dataset's test split gets the same statistics on its own.
  EXPECT_EQ(load_dataset(cfg, false, 0).mean, mean);

  DataConfig given = cfg;
  given.mean = {0.5};
  given.std = {0.1, 0.2, 0.3};
  const ImageDataset train = load_dataset(given, true, 0);
  EXPECT_EQ(train.mean, (std::vector<float>{0.5f, 0.5f, 0.5f}));
  EXPECT_EQ(train.std, (std::vector<float>{0.1f, 0.2f, 0.3f}));
  given.std = {0.1, 0.2};
  EXPECT_THAT(usage_error_of([&] { load_dataset(given, true, 0); }),
              HasSubstr("data.std: 2 values, but image-folder images have 3 channels"));
}

TEST_F(ImageFolder, DecodingIsTheSameWithAnyNumberOfThreadsAndLimitKeepsAPrefix) {
  ImageFolderOptions one;
  one.threads = 1;
  ImageFolderOptions many;
  many.threads = 8;
  const std::string train = dir / "train";
  EXPECT_EQ(read_image_folder(train, one).pixels, read_image_folder(train, many).pixels);
  many.limit = 2;
  const ImageDataset two = read_image_folder(train, many);
  EXPECT_EQ(two.size, 2);
  EXPECT_EQ(two.num_classes, 2);
  EXPECT_EQ(two.pixels.size(), 2u * 3 * 4 * 6);
}

TEST_F(ImageFolder, ResizesTheShorterSideThenCropsTheCentre) {
  ScratchDir other;
  // 12 x 8, R = 20 * x: halving (shorter side 8 -> 4) averages column pairs to 40 j + 10 over
  // 6 columns; the centre 4 start at column 1 (torchvision's round(2 / 2)).
  cv::Mat image(8, 12, CV_8UC3);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 12; ++x)
      image.at<cv::Vec3b>(y, x) = cv::Vec3b(0, 0, static_cast<std::uint8_t>(20 * x));
  }
  write_image(other / "k", "wide.png", image);
  write_image(other / "k", "tall.png", pattern(5, 9, 0));  // 5x9 -> 4x7 (int(4 * 9 / 5)) -> 4x4
  ImageFolderOptions options;
  options.image_size = 4;
  const ImageDataset d = read_image_folder(other.path(), options);
  ASSERT_EQ(d.height, 4);
  ASSERT_EQ(d.width, 4);
  const std::uint8_t* wide = d.image(1);  // "tall" < "wide"
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) EXPECT_EQ(wide[y * 4 + x], 40 * (x + 1) + 10) << y << "," << x;
  }
}

TEST_F(ImageFolder, JpegDecodesCloseToWhatWasWritten) {
  ScratchDir other;
  cv::Mat flat(16, 16, CV_8UC3, cv::Scalar(30, 120, 220));  // B, G, R
  cv::imwrite(other / "one.jpg", flat, {cv::IMWRITE_JPEG_QUALITY, 95});
  fs::create_directories(other / "c");
  fs::rename(other / "one.jpg", other / "c/one.jpg");
  const ImageDataset d = read_image_folder(other.path(), {});
  ASSERT_EQ(d.size, 1);
  EXPECT_NEAR(d.image(0)[0], 220, 3);        // R plane
  EXPECT_NEAR(d.image(0)[256], 120, 3);      // G
  EXPECT_NEAR(d.image(0)[512 + 17], 30, 3);  // B
}

TEST_F(ImageFolder, MixedSizesWithoutImageSizeNameBothFiles) {
  write_image(dir / "train/cat", "c9.png", pattern(5, 4, 0));
  const std::string message = usage_error_of([&] { read_image_folder(dir / "train", {}); });
  EXPECT_THAT(message, AllOf(HasSubstr("c9.png: 5x4 pixels, but "), HasSubstr("a0.png is 6x4"),
                             HasSubstr("set data.image_size")));
  ImageFolderOptions resized;
  resized.image_size = 3;
  EXPECT_EQ(read_image_folder(dir / "train", resized).size, 6);
}

TEST_F(ImageFolder, CorruptFilesAreNamed) {
  write_bytes(dir / "train/cat/junk.png", {'n', 'o', 't', ' ', 'p', 'n', 'g'});
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(dir.path()), 0); }),
              AllOf(HasSubstr("train/cat/junk.png: corrupt or unsupported image"),
                    ::testing::Not(HasSubstr("\n"))));
  fs::remove(dir / "train/cat/junk.png");

  // A cut-off PNG and a cut-off JPEG: what an interrupted copy leaves.
  const std::vector<std::uint8_t> png = test_files::read_bytes(dir / "train/cat/c0.PNG");
  write_bytes(dir / "train/cat/cut.png", {png.begin(), png.begin() + png.size() / 2});
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", {}); }),
              HasSubstr("train/cat/cut.png: corrupt PNG (libpng: "));
  fs::remove(dir / "train/cat/cut.png");

  cv::Mat noise(48, 64, CV_8UC3);
  cv::RNG(7).fill(noise, cv::RNG::UNIFORM, 0, 256);  // so the scan data is most of the file
  cv::imwrite(dir / "whole.jpg", noise);
  const std::vector<std::uint8_t> jpeg = test_files::read_bytes(dir / "whole.jpg");
  write_bytes(dir / "train/cat/cut.jpg", {jpeg.begin(), jpeg.begin() + jpeg.size() * 2 / 3});
  ImageFolderOptions resized;
  resized.image_size = 4;
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", resized); }),
              HasSubstr("train/cat/cut.jpg: corrupt JPEG (libjpeg: Premature end of JPEG file)"));
  write_bytes(dir / "train/cat/empty.jpg", {});
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", resized); }),
              HasSubstr("train/cat/cut.jpg"));  // the first bad file in order
  fs::remove(dir / "train/cat/cut.jpg");
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", resized); }),
              HasSubstr("train/cat/empty.jpg: empty file"));
  fs::remove(dir / "train/cat/empty.jpg");

  // Damage inside the compressed data of a file that still ends properly: the scan cut short
  // by an end-of-image marker.
  std::vector<std::uint8_t> damaged(jpeg.begin(), jpeg.begin() + jpeg.size() * 2 / 3);
  damaged.push_back(0xff);
  damaged.push_back(0xd9);
  write_bytes(dir / "train/cat/damaged.jpg", damaged);
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", resized); }),
              HasSubstr("train/cat/damaged.jpg: corrupt JPEG (libjpeg: Corrupt JPEG data"));
}

// A PNG whose header announces width x height RGB pixels, with next to no pixel data.
std::vector<std::uint8_t> png_header_only(std::uint32_t width, std::uint32_t height) {
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto chunk = [&](const char* type, std::vector<std::uint8_t> body) {
    const std::uint32_t length = static_cast<std::uint32_t>(body.size());
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(length >> s));
    body.insert(body.begin(), type, type + 4);
    const auto crc =
        static_cast<std::uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size())));
    out.insert(out.end(), body.begin(), body.end());
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(crc >> s));
  };
  std::vector<std::uint8_t> ihdr;
  for (std::uint32_t v : {width, height}) {
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(static_cast<std::uint8_t>(v >> s));
  }
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  chunk("IHDR", ihdr);
  chunk("IDAT", {0x78, 0x9c});  // the header is read up to the first data chunk
  chunk("IEND", {});
  return out;
}

TEST_F(ImageFolder, HugeAnnouncedSizesAreRefusedBeforeDecoding) {
  write_bytes(dir / "train/cat/huge.png", png_header_only(20000, 20000));
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "train", {}); }),
              HasSubstr("huge.png: 20000x20000 pixels, more than 67108864 an image may have"));
}

// Bytes of `values`, each `bytes` long, little- or big-endian, after `out`.
void put(std::vector<std::uint8_t>& out, std::initializer_list<std::uint64_t> values, int bytes,
         bool big_endian = false) {
  for (const std::uint64_t v : values) {
    for (int i = 0; i < bytes; ++i) {
      const int shift = 8 * (big_endian ? bytes - 1 - i : i);
      out.push_back(static_cast<std::uint8_t>(v >> shift));
    }
  }
}

std::vector<std::uint8_t> text_bytes(const std::string& text) { return {text.begin(), text.end()}; }

// One entry of a TIFF directory: a tag, its type and its one value.
struct TiffEntry {
  std::uint64_t tag, type, value;
};

// A TIFF of one directory holding `entries` and nothing else, classic or BigTIFF.
std::vector<std::uint8_t> tiff_of(const std::vector<TiffEntry>& entries, bool big_endian = false,
                                  bool big_tiff = false) {
  std::vector<std::uint8_t> out = text_bytes(big_endian ? "MM" : "II");
  const int offset_bytes = big_tiff ? 8 : 4;
  put(out, {big_tiff ? 43u : 42u}, 2, big_endian);
  if (big_tiff) put(out, {8, 0}, 2, big_endian);              // the offsets' size, then 0
  put(out, {big_tiff ? 16u : 8u}, offset_bytes, big_endian);  // the first directory's offset
  put(out, {entries.size()}, big_tiff ? 8 : 2, big_endian);
  for (const TiffEntry& e : entries) {
    put(out, {e.tag, e.type}, 2, big_endian);
    put(out, {1}, offset_bytes, big_endian);  // the count
    // The value at the start of its field: BYTE 1, SHORT 2, LONG 4, LONG8 8 bytes.
    const int bytes = e.type == 1 ? 1 : e.type == 3 ? 2 : e.type == 4 ? 4 : 8;
    put(out, {e.value}, std::min(bytes, offset_bytes), big_endian);
    for (int pad = bytes; pad < offset_bytes; ++pad) out.push_back(0);
  }
  put(out, {0}, offset_bytes, big_endian);  // no next directory
  return out;
}

// ImageWidth as a LONG and ImageLength as a SHORT.
std::vector<std::uint8_t> tiff_header_only(bool big_endian, std::uint64_t width,
                                           std::uint64_t height) {
  return tiff_of({{256, 4, width}, {257, 3, height}}, big_endian);
}

// BMP, PPM, TIFF and lossless WebP go through OpenCV and decode to the pixels written (lossy
// WebP to its size). A header of each that announces more pixels than the limit is refused
// before OpenCV decodes it (a 10 KB WebP of one colour decodes to 768 MB), however it says it
// (both BMP headers, a PNM width behind zeros or a comment ended by a carriage return, TIFF in
// either byte order or as a BigTIFF, its first entry of a tag counting as libtiff's does, tiles
// or strips larger than the image), and so are a header cut short and a file of none of the
// formats.
TEST_F(ImageFolder, OpenCvFormatsDecodeExactlyAndHugeHeadersAreRefused) {
  ScratchDir exact;
  const cv::Mat image = pattern(6, 4, 40);
  for (const char* name : {"a.bmp", "b.ppm", "c.tiff", "d.webp"}) {
    fs::create_directories(exact / "k");
    EXPECT_TRUE(
        cv::imwrite(exact / (std::string("k/") + name), image, {cv::IMWRITE_WEBP_QUALITY, 101}))
        << name;
  }
  ImageDataset decoded = read_image_folder(exact.path(), {});
  ASSERT_EQ(decoded.size, 4);
  for (std::int64_t i = 0; i < decoded.size; ++i) {
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 6; ++x) {
        const std::uint8_t* at = decoded.image(i) + y * 6 + x;
        EXPECT_EQ(at[0], 40 + x + y) << i;  // R
        EXPECT_EQ(at[24], 40 + y) << i;     // G
        EXPECT_EQ(at[48], 40 + x) << i;     // B
      }
    }
  }
  ScratchDir lossy;
  fs::create_directories(lossy / "k");
  EXPECT_TRUE(cv::imwrite(lossy / "k/lossy.webp", image, {cv::IMWRITE_WEBP_QUALITY, 90}));
  EXPECT_EQ(test_files::read_bytes(lossy / "k/lossy.webp")[15], ' ');  // "VP8 ": lossy
  decoded = read_image_folder(lossy.path(), {});
  EXPECT_EQ(decoded.size * decoded.height * decoded.width, 24);

  std::vector<std::uint8_t> bmp = text_bytes("BM");
  put(bmp, {70, 0, 54, 40, 20000, static_cast<std::uint32_t>(-20000)}, 4);  // top-down rows
  put(bmp, {1, 24}, 2);
  bmp.resize(70);
  std::vector<std::uint8_t> os2_bmp = text_bytes("BM");
  put(os2_bmp, {40, 0, 26, 12}, 4);
  put(os2_bmp, {20000, 20000, 1, 24}, 2);
  std::vector<std::uint8_t> webp_x = text_bytes("RIFF");
  put(webp_x, {30}, 4);
  for (const char* part : {"WEBP", "VP8X"}) webp_x.insert(webp_x.end(), part, part + 4);
  put(webp_x, {10, 0}, 4);
  put(webp_x, {19999, 19999}, 3);
  std::vector<std::uint8_t> webp_l = text_bytes("RIFF");
  put(webp_l, {30}, 4);
  for (const char* part : {"WEBP", "VP8L"}) webp_l.insert(webp_l.end(), part, part + 4);
  put(webp_l, {5}, 4);
  put(webp_l, {0x2f}, 1);
  put(webp_l, {16383 | (16383u << 14)}, 4);
  auto cut = [](std::vector<std::uint8_t> bytes, std::size_t keep) {
    bytes.resize(keep);
    return bytes;
  };
  const std::vector<std::pair<std::vector<std::uint8_t>, std::string>> refused = {
      {bmp, "20000x20000 pixels, more than 67108864 an image may have"},
      {os2_bmp, "20000x20000 pixels, more"},
      {text_bytes("P6\n# made by hand\n20000 20000\n255\nabc"), "20000x20000 pixels, more"},
      {text_bytes("P5 99999999999999999999 1 255 x"), "4294967296x1 pixels, more"},
      {tiff_header_only(false, 20000, 20000), "20000x20000 pixels, more"},
      {tiff_header_only(true, 20000, 20000), "20000x20000 pixels, more"},
      {tiff_of({{256, 4, 20000}, {257, 16, 20000}}, true, true), "20000x20000 pixels, more"},
      {tiff_of({{256, 4, 20000}, {256, 3, 1}, {257, 4, 20000}}), "20000x20000 pixels, more"},
      {tiff_of({{256, 3, 1}, {257, 3, 1}, {322, 4, 16000}, {323, 4, 16000}}),
       "its TIFF tiles or strips are 16000x16000 pixels, more"},
      {tiff_of({{256, 3, 8}, {257, 3, 1}, {278, 4, 1u << 24}}),
       "its TIFF tiles or strips are 8x16777216 pixels, more"},
      {tiff_of({{256, 16, 1}, {257, 3, 1}}), "corrupt TIFF (its header does not say the"},
      {text_bytes("P4 000000000020000 000000000020000\n"), "20000x20000 pixels, more"},
      {text_bytes("P6 #\r20000 20000\n1 1\n255\n"), "20000x20000 pixels, more"},
      {webp_x, "20000x20000 pixels, more"},
      {webp_l, "16384x16384 pixels, more"},
      {cut(bmp, 20), "corrupt BMP (its header does not say the image's size)"},
      {cut(webp_l, 22), "corrupt WebP (its header does not say the"},
      {text_bytes("P6\n640 "), "corrupt PPM/PGM/PBM (its header does not say the"},
      {cut(tiff_header_only(true, 1, 1), 16), "corrupt TIFF (its header does not say the"},
      {text_bytes("GIF89a\x01\x00\x01\x00"),
       "corrupt or unsupported image (not a JPEG, PNG, BMP, PPM/PGM/PBM, TIFF or WebP file)"},
  };
  ScratchDir huge;
  fs::create_directories(huge / "k");
  for (const auto& [bytes, says] : refused) {
    write_bytes(huge / "k/x.bmp", bytes);
    EXPECT_THAT(usage_error_of([&] { read_image_folder(huge.path(), {}); }),
                AllOf(HasSubstr("k/x.bmp: " + says), ::testing::Not(HasSubstr("\n"))));
  }
}

// A strip resized so its shorter side is image_size would hold far more pixels than it has
// (40000 x 1 at 224: 224 x 8960000) before the crop: refused, not allocated.
TEST_F(ImageFolder, AStripTooLongToResizeIsRefused) {
  ScratchDir other;
  write_image(other / "k", "strip.png", pattern(40000, 1, 0));
  ImageFolderOptions options;
  options.image_size = 224;
  EXPECT_THAT(usage_error_of([&] { read_image_folder(other.path(), options); }),
              HasSubstr("strip.png: 40000x1 pixels, resized to 224 on its shorter side, would "
                        "have more than 67108864 pixels (an aspect ratio of at most 1337 to 1 "
                        "fits)"));
}

TEST_F(ImageFolder, BrokenLayoutsAreOneLineErrors) {
  fs::create_directories(dir / "train/dog");
  write_bytes(dir / "train/dog/readme.txt", {'x'});
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(dir.path()), 0); }),
              HasSubstr("train/dog: empty class folder"));
  fs::remove_all(dir / "train/dog");

  write_image(dir / "val/emu", "e.png", pattern(6, 4, 0));
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(dir.path()), 0); }),
              HasSubstr("val/emu: class 'emu' is not one of the 2 classes of the training split"));
  fs::remove_all(dir / "val");
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(dir.path()), 0); }),
              HasSubstr("/val not found"));
  write_image(dir / "test/cat", "t.png", pattern(6, 4, 0));  // test/ stands in for val/
  EXPECT_EQ(load_splits(folder_config(dir.path()), 0).test.size, 1);
  write_image(dir / "test/cat", "t.png", pattern(7, 4, 0));
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(dir.path()), 0); }),
              HasSubstr("images are 3x4x7 but the training split's are 3x4x6"));

  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "nowhere", {}); }),
              HasSubstr("nowhere: no such folder"));
  fs::create_directories(dir / "bare");
  EXPECT_THAT(usage_error_of([&] { read_image_folder(dir / "bare", {}); }),
              HasSubstr("bare: no class folders"));
  EXPECT_THAT(usage_error_of([&] { load_splits(folder_config(""), 0); }),
              HasSubstr("set data.root"));
}

}  // namespace
}  // namespace partrain::data
