#include "trainer/data/image_folder.h"

// jpeglib.h needs FILE and size_t declared before it.
#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <opencv2/core.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <system_error>
#include <thread>

#include "common/errors.h"

namespace partrain::data {

namespace fs = std::filesystem;

namespace {

// Larger files are refused before they are read: no photograph a classifier trains on comes
// near this, and a wrong path (a disk image, a video) should not be pulled into memory.
constexpr std::uintmax_t kMaxImageFileBytes = 256u << 20;

struct ImageFile {
  std::string path;
  std::int64_t label = 0;
};

bool is_image_name(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const char* known :
       {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".pbm", ".tif", ".tiff", ".webp"}) {
    if (ext == known) return true;
  }
  return false;
}

// Sorted sub-folder names (directories == true) or image file paths of `dir`.
std::vector<std::string> list_entries(const fs::path& dir, bool directories) {
  std::error_code ec;
  std::vector<std::string> out;
  fs::directory_iterator it(dir, ec);
  PARTRAIN_CHECK(!ec, UsageError, dir.string(), ": cannot list: ", ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    PARTRAIN_CHECK(!ec, UsageError, dir.string(), ": cannot list: ", ec.message());
    const fs::path& p = it->path();
    if (directories) {
      if (it->is_directory(ec)) out.push_back(p.filename().string());
    } else if (is_image_name(p) && !it->is_directory(ec)) {
      out.push_back(p.string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  // A FIFO or device named like an image would block or never end; only plain files are read.
  PARTRAIN_CHECK(fs::is_regular_file(path, ec), UsageError, path, ": not a regular file");
  const std::uintmax_t bytes = fs::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, path, ": cannot read its size: ", ec.message());
  PARTRAIN_CHECK(bytes > 0, UsageError, path, ": empty file, not an image");
  PARTRAIN_CHECK(bytes <= kMaxImageFileBytes, UsageError, path, ": ", bytes,
                 " bytes, more than the ", kMaxImageFileBytes, " an image file may have");
  std::vector<std::uint8_t> data(static_cast<std::size_t>(bytes));
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open for reading");
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size()));
  PARTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(data.size()), UsageError, path,
                 ": read failed at byte ", in.gcount(), " of ", bytes);
  return data;
}

bool starts_with(const std::vector<std::uint8_t>& data, std::initializer_list<std::uint8_t> magic) {
  return data.size() >= magic.size() && std::equal(magic.begin(), magic.end(), data.begin());
}

// Whether an image, or a piece of one that a decoder allocates at once, of width x height pixels
// is within kMaxImagePixels (each side first, so that the product cannot wrap).
bool within_pixel_limit(std::uint64_t width, std::uint64_t height) {
  return width <= kMaxImagePixels && height <= kMaxImagePixels && width * height <= kMaxImagePixels;
}

// The error for image `path` of width x height pixels past the limit, whatever decodes it.
UsageError too_many_pixels(const std::string& path, std::uint64_t width, std::uint64_t height) {
  return UsageError(detail::concat(path, ": ", width, "x", height, " pixels, more than ",
                                   kMaxImagePixels, " an image may have"));
}

// JPEG goes through libjpeg(-turbo) directly rather than OpenCV: OpenCV lets libjpeg print
// its warnings ("Premature end of JPEG file", "Corrupt JPEG data") to stderr and returns a
// grey-filled image, so a truncated or damaged file would train silently. Here every warning
// is an error that names the file.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);  // a warning: the data is damaged
}

// Decodes to 8-bit RGB; an empty Mat for CMYK files, which OpenCV converts instead.
cv::Mat decode_jpeg(const std::string& path, const std::vector<std::uint8_t>& data) {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_fail;
  errors.mgr.emit_message = jpeg_message;
  // Everything that lives across the setjmp is declared first and only read after it by
  // its destructor (the jump lands in this frame, so it runs normally).
  cv::Mat image;
  bool cmyk = false;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    throw UsageError(detail::concat(path, ": corrupt JPEG (libjpeg: ", errors.message, ")"));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (!within_pixel_limit(cinfo.image_width, cinfo.image_height)) {
    const UsageError error = too_many_pixels(path, cinfo.image_width, cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    throw error;
  }
  cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  if (!cmyk) {
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    image.create(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width),
                 CV_8UC3);
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = image.ptr<std::uint8_t>(static_cast<int>(cinfo.output_scanline));
      jpeg_read_scanlines(&cinfo, &row, 1);  // each call makes progress or fails
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return image;
}

// PNG through libpng's simplified API, which reports damage (bad CRC, cut-off data) as an
// error message instead of printing it. Alpha is dropped, as PIL's convert("RGB") does.
cv::Mat decode_png(const std::string& path, const std::vector<std::uint8_t>& data) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(&png, data.data(), data.size()) == 0) {
    throw UsageError(detail::concat(path, ": corrupt PNG (libpng: ", png.message, ")"));
  }
  if (!within_pixel_limit(png.width, png.height)) {
    png_image_free(&png);
    throw too_many_pixels(path, png.width, png.height);
  }
  png.format = PNG_FORMAT_RGBA;
  cv::Mat rgba(static_cast<int>(png.height), static_cast<int>(png.width), CV_8UC4);
  if (png_image_finish_read(&png, nullptr, rgba.data, static_cast<png_int_32>(rgba.step),
                            nullptr) == 0) {
    const std::string message = png.message;
    png_image_free(&png);
    throw UsageError(detail::concat(path, ": corrupt PNG (libpng: ", message, ")"));
  }
  cv::Mat rgb;
  cv::cvtColor(rgba, rgb, cv::COLOR_RGBA2RGB);
  return rgb;
}

// Width and height of an image in a format OpenCV decodes here (BMP, PPM/PGM/PBM, TIFF, WebP),
// read from its header: OpenCV allocates what a header announces (up to 2^30 pixels, 3 GB)
// before it finds the pixels missing, so the limit is checked first, as for JPEG and PNG.
struct Extent {
  std::uint64_t width = 0, height = 0;
  // What the decoder allocates at a time where the header sets it apart from the image's size
  // (TIFF's tiles and strips); 0: the image's width or height.
  std::uint64_t piece_width = 0, piece_height = 0;
};

// `n` bytes at `at`, little- or big-endian; nullopt past the end.
std::optional<std::uint64_t> number_at(const std::vector<std::uint8_t>& data, std::uint64_t at,
                                       int n, bool big_endian = false) {
  if (at > data.size() || static_cast<std::uint64_t>(n) > data.size() - at) return std::nullopt;
  std::uint64_t value = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t byte = data[at + (big_endian ? i : n - 1 - i)];
    value = (value << 8) | byte;
  }
  return value;
}

std::optional<Extent> bmp_extent(const std::vector<std::uint8_t>& data) {
  const auto header = number_at(data, 14, 4);
  if (!header) return std::nullopt;
  if (*header == 12) {  // the OS/2 1.x header: 16-bit sizes
    const auto w = number_at(data, 18, 2), h = number_at(data, 20, 2);
    if (!w || !h) return std::nullopt;
    return Extent{*w, *h};
  }
  const auto w = number_at(data, 18, 4), h = number_at(data, 22, 4);
  if (!w || !h) return std::nullopt;
  // Signed 32-bit: a negative height stores the rows top-down.
  auto magnitude = [](std::uint64_t v) {
    const auto s = static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    return static_cast<std::uint64_t>(s < 0 ? -static_cast<std::int64_t>(s) : s);
  };
  return Extent{magnitude(*w), magnitude(*h)};
}

// "P6 640 480 255": the two numbers after the magic, past blanks and # comments (which end at
// a carriage return or a line feed, as OpenCV ends them).
std::optional<Extent> pnm_extent(const std::vector<std::uint8_t>& data) {
  std::size_t at = 2;
  std::uint64_t numbers[2] = {0, 0};
  for (std::uint64_t& number : numbers) {
    while (at < data.size() && (std::isspace(data[at]) != 0 || data[at] == '#')) {
      if (data[at] == '#') {
        while (at < data.size() && data[at] != '\n' && data[at] != '\r') ++at;
      } else {
        ++at;
      }
    }
    const std::size_t first = at;
    // Held at 2^32 once past it (OpenCV refuses more than INT_MAX): beyond any limit, and no
    // count of digits, leading zeros included, can wrap it.
    for (; at < data.size() && std::isdigit(data[at]) != 0; ++at) {
      number = std::min<std::uint64_t>(number * 10 + (data[at] - '0'), 1ull << 32);
    }
    if (at == first) return std::nullopt;
  }
  return Extent{numbers[0], numbers[1]};
}

// The first directory of a classic TIFF or a BigTIFF: ImageWidth (256) and ImageLength (257),
// and the size of the pieces OpenCV decodes at a time, which it allocates as they say: tiles
// (TileWidth 322 by TileLength 323) or strips (the width by RowsPerStrip 278). As libtiff does,
// the first entry of a tag counts.
std::optional<Extent> tiff_extent(const std::vector<std::uint8_t>& data) {
  const bool big_endian = data[0] == 'M';
  const bool big_tiff = number_at(data, 2, 2, big_endian) == 43u;
  const auto directory = number_at(data, big_tiff ? 8 : 4, big_tiff ? 8 : 4, big_endian);
  if (!directory) return std::nullopt;
  const auto entries = number_at(data, *directory, big_tiff ? 8 : 2, big_endian);
  if (!entries) return std::nullopt;
  const std::uint64_t entry_bytes = big_tiff ? 20 : 12;
  const std::uint64_t first = *directory + (big_tiff ? 8 : 2);
  std::optional<std::uint64_t> width, height, tile_width, tile_length, rows_per_strip;
  // Each entry must lie inside the file: the loop ends with the data whatever the count says.
  for (std::uint64_t i = 0; i < *entries; ++i) {
    const std::uint64_t at = first + i * entry_bytes;
    if (at > data.size() || entry_bytes > data.size() - at) break;
    const auto tag = number_at(data, at, 2, big_endian);
    std::optional<std::uint64_t>* slot = *tag == 256   ? &width
                                         : *tag == 257 ? &height
                                         : *tag == 322 ? &tile_width
                                         : *tag == 323 ? &tile_length
                                         : *tag == 278 ? &rows_per_strip
                                                       : nullptr;
    if (slot == nullptr || slot->has_value()) continue;
    // One value, held in the entry's value field: BYTE, SHORT, LONG, their signed kinds, and in
    // a BigTIFF LONG8 and SLONG8. libtiff refuses any other count; a value that does not fit
    // the field (an offset to it instead) is refused here too.
    const auto type = number_at(data, at + 2, 2, big_endian);
    const auto count = number_at(data, at + 4, big_tiff ? 8 : 4, big_endian);
    const int bytes = *type == 1                                 ? 1
                      : *type == 3 || *type == 8                 ? 2
                      : *type == 4 || *type == 9                 ? 4
                      : big_tiff && (*type == 16 || *type == 17) ? 8
                                                                 : 0;
    if (bytes == 0 || count != 1u) return std::nullopt;
    *slot = number_at(data, at + (big_tiff ? 12 : 8), bytes, big_endian);
  }
  if (!width || !height) return std::nullopt;
  Extent extent{*width, *height};
  if (tile_width || tile_length) {
    extent.piece_width = tile_width.value_or(0);
    extent.piece_height = tile_length.value_or(0);
  } else if (rows_per_strip && *rows_per_strip != 0 && *rows_per_strip != 0xffffffffu) {
    extent.piece_height = *rows_per_strip;
  }
  return extent;
}

std::optional<Extent> webp_extent(const std::vector<std::uint8_t>& data) {
  const auto chunk = number_at(data, 12, 4, /*big_endian=*/true);
  if (chunk == 0x56503820u) {  // "VP8 ": a key frame's start code, then 14-bit sizes
    if (number_at(data, 23, 3, true) != 0x9d012au) return std::nullopt;
    const auto w = number_at(data, 26, 2), h = number_at(data, 28, 2);
    if (!w || !h) return std::nullopt;
    return Extent{*w & 0x3fff, *h & 0x3fff};
  }
  if (chunk == 0x5650384cu) {  // "VP8L": a signature byte, then 14 bits each of size - 1
    const auto bits = number_at(data, 21, 4);
    if (number_at(data, 20, 1) != 0x2fu || !bits) return std::nullopt;
    return Extent{(*bits & 0x3fff) + 1, ((*bits >> 14) & 0x3fff) + 1};
  }
  if (chunk == 0x56503858u) {  // "VP8X": the canvas, 24 bits each of size - 1
    const auto w = number_at(data, 24, 3), h = number_at(data, 27, 3);
    if (!w || !h) return std::nullopt;
    return Extent{*w + 1, *h + 1};
  }
  return std::nullopt;
}

// The extent of a file OpenCV is to decode; a UsageError naming `path` where its format is none
// of those or its header is cut short, or where it announces more than kMaxImagePixels.
void check_opencv_extent(const std::string& path, const std::vector<std::uint8_t>& data) {
  std::optional<Extent> extent;
  const char* format = nullptr;
  if (starts_with(data, {'B', 'M'})) {
    format = "BMP";
    extent = bmp_extent(data);
  } else if (data.size() >= 2 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6') {
    format = "PPM/PGM/PBM";
    extent = pnm_extent(data);
  } else if (starts_with(data, {'I', 'I', '*', 0}) || starts_with(data, {'M', 'M', 0, '*'}) ||
             starts_with(data, {'I', 'I', '+', 0}) || starts_with(data, {'M', 'M', 0, '+'})) {
    format = "TIFF";
    extent = tiff_extent(data);
  } else if (starts_with(data, {'R', 'I', 'F', 'F'}) &&
             number_at(data, 8, 4, /*big_endian=*/true) == 0x57454250u) {  // "WEBP"
    format = "WebP";
    extent = webp_extent(data);
  }
  PARTRAIN_CHECK(format != nullptr, UsageError, path,
                 ": corrupt or unsupported image (not a JPEG, PNG, BMP, PPM/PGM/PBM, TIFF or WebP "
                 "file)");
  PARTRAIN_CHECK(extent.has_value(), UsageError, path, ": corrupt ", format,
                 " (its header does not say the image's size)");
  if (!within_pixel_limit(extent->width, extent->height)) {
    throw too_many_pixels(path, extent->width, extent->height);
  }
  const std::uint64_t piece_width = extent->piece_width != 0 ? extent->piece_width : extent->width;
  const std::uint64_t piece_height =
      extent->piece_height != 0 ? extent->piece_height : extent->height;
  PARTRAIN_CHECK(within_pixel_limit(piece_width, piece_height), UsageError, path, ": its ", format,
                 " tiles or strips are ", piece_width, "x", piece_height, " pixels, more than ",
                 kMaxImagePixels, " an image may have");
}

// Python's round() (half to even) of diff / 2, as torchvision's CenterCrop computes offsets.
int centre_offset(int diff) {
  const int half = diff / 2;
  if (diff % 2 == 0) return half;
  return half % 2 == 0 ? half : half + 1;
}

// Decodes `path` to 8-bit RGB and, when size > 0, brings it to size x size.
cv::Mat decode_image(const std::string& path, int size) {
  const std::vector<std::uint8_t> data = read_file(path);
  cv::Mat image;
  if (starts_with(data, {0xff, 0xd8, 0xff})) {
    image = decode_jpeg(path, data);
  } else if (starts_with(data, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'})) {
    image = decode_png(path, data);
  }
  if (image.empty()) {
    // BMP, PPM/PGM, TIFF, WebP and CMYK JPEG: OpenCV. EXIF orientation is ignored, as
    // torchvision's ImageFolder (PIL) ignores it.
    if (!starts_with(data, {0xff, 0xd8, 0xff})) check_opencv_extent(path, data);
    cv::Mat bgr;
    try {
      bgr = cv::imdecode(cv::Mat(1, static_cast<int>(data.size()), CV_8UC1,
                                 const_cast<std::uint8_t*>(data.data())),
                         cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
    } catch (const cv::Exception& e) {
      throw UsageError(
          detail::concat(path, ": corrupt or unsupported image (OpenCV: ", e.msg, ")"));
    }
    PARTRAIN_CHECK(!bgr.empty(), UsageError, path,
                   ": corrupt or unsupported image (OpenCV cannot decode its ", data.size(),
                   " bytes)");
    cv::cvtColor(bgr, image, cv::COLOR_BGR2RGB);
  }
  if (size <= 0) return image;
  const int h = image.rows, w = image.cols;
  // torchvision's Resize(int): the shorter side becomes `size`, the longer one
  // int(size * long / short).
  const std::int64_t long_side = std::int64_t{size} * std::max(h, w) / std::min(h, w);
  // A strip (1 x 100000 pixels, say) would be resized to far more pixels than it has before the
  // crop keeps size x size of them.
  PARTRAIN_CHECK(
      static_cast<std::uint64_t>(long_side) * static_cast<std::uint64_t>(size) <= kMaxImagePixels,
      UsageError, path, ": ", w, "x", h, " pixels, resized to ", size,
      " on its shorter side, would have more than ", kMaxImagePixels,
      " pixels (an aspect ratio of at most ", kMaxImagePixels / size / size, " to 1 fits)");
  const int new_h = w <= h ? static_cast<int>(long_side) : size;
  const int new_w = w <= h ? size : static_cast<int>(long_side);
  if (new_h != h || new_w != w) {
    // INTER_AREA averages the source pixels each output pixel covers (antialiased, like
    // PIL's resampling that torchvision uses); for enlarging it is bilinear.
    cv::Mat resized;
    cv::resize(image, resized, cv::Size(new_w, new_h), 0, 0,
               new_h < h ? cv::INTER_AREA : cv::INTER_LINEAR);
    image = resized;
  }
  const cv::Rect crop(centre_offset(new_w - size), centre_offset(new_h - size), size, size);
  return image(crop).clone();
}

// Writes an 8-bit interleaved RGB image as planar R, G, B.
void store_planar(const cv::Mat& rgb, std::uint8_t* out) {
  const std::int64_t plane = static_cast<std::int64_t>(rgb.rows) * rgb.cols;
  for (int y = 0; y < rgb.rows; ++y) {
    const auto* row = rgb.ptr<cv::Vec3b>(y);
    for (int x = 0; x < rgb.cols; ++x) {
      const std::int64_t p = static_cast<std::int64_t>(y) * rgb.cols + x;
      out[p] = row[x][0];
      out[plane + p] = row[x][1];
      out[2 * plane + p] = row[x][2];
    }
  }
}

}  // namespace

std::vector<std::string> list_image_classes(const std::string& dir) {
  std::error_code ec;
  PARTRAIN_CHECK(fs::is_directory(dir, ec), UsageError, dir,
                 ": no such folder (image-folder expects DIR/<class>/<image files>)");
  std::vector<std::string> classes = list_entries(dir, true);
  PARTRAIN_CHECK(!classes.empty(), UsageError, dir,
                 ": no class folders (image-folder expects DIR/<class>/<image files>)");
  return classes;
}

ImageDataset read_image_folder(const std::string& dir, const ImageFolderOptions& options) {
  const std::vector<std::string> found = list_image_classes(dir);
  const std::vector<std::string>& classes = options.classes.empty() ? found : options.classes;
  std::vector<ImageFile> files;
  for (const std::string& name : found) {
    const auto it = std::find(classes.begin(), classes.end(), name);
    PARTRAIN_CHECK(it != classes.end(), UsageError, (fs::path(dir) / name).string(), ": class '",
                   name, "' is not one of the ", classes.size(), " classes of the training split");
    const std::int64_t label = it - classes.begin();
    const std::vector<std::string> images = list_entries(fs::path(dir) / name, false);
    PARTRAIN_CHECK(!images.empty(), UsageError, (fs::path(dir) / name).string(),
                   ": empty class folder (no .jpg, .jpeg, .png, .bmp, .ppm, .pgm, .pbm, .tif, "
                   ".tiff or .webp files)");
    for (const std::string& path : images) files.push_back({path, label});
  }
  if (options.limit > 0 && options.limit < static_cast<std::int64_t>(files.size())) {
    files.resize(static_cast<std::size_t>(options.limit));
  }

  // OpenCV's own log lines (e.g. about an unknown TIFF tag) would reach stderr; errors are
  // reported here, one line each.
  cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);

  // The first image fixes the size when images are kept as they are.
  const cv::Mat first = decode_image(files[0].path, options.image_size);
  ImageDataset out;
  out.name = "image-folder";
  out.size = static_cast<std::int64_t>(files.size());
  out.channels = 3;
  out.height = first.rows;
  out.width = first.cols;
  out.num_classes = static_cast<int>(classes.size());
  const std::uint64_t pixel_bytes = static_cast<std::uint64_t>(out.size) * out.sample_bytes();
  PARTRAIN_CHECK(pixel_bytes <= kMaxDatasetBytes, UsageError, dir, ": ", out.size, " images of 3x",
                 out.height, "x", out.width, " (", pixel_bytes, " bytes) exceed the ",
                 kMaxDatasetBytes,
                 " bytes held in memory; set data.image_size or data.train_limit / test_limit");
  out.pixels.resize(pixel_bytes);
  out.labels.resize(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) out.labels[i] = files[i].label;
  store_planar(first, out.pixels.data());

  // Threads take the next undecoded index until none is left or one failed; each runs through
  // a finite list, so joining them is bounded by the work itself. Of several failures the one
  // with the lowest index is reported, so the message does not depend on timing.
  std::atomic<std::int64_t> next{1};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::int64_t error_index = out.size;
  std::exception_ptr error;
  auto work = [&] {
    for (std::int64_t i = next++; i < out.size && !failed; i = next++) {
      const ImageFile& file = files[static_cast<std::size_t>(i)];
      try {
        const cv::Mat image = decode_image(file.path, options.image_size);
        PARTRAIN_CHECK(image.rows == out.height && image.cols == out.width, UsageError, file.path,
                       ": ", image.cols, "x", image.rows, " pixels, but ", files[0].path, " is ",
                       out.width, "x", out.height,
                       "; set data.image_size to resize them to one size");
        store_planar(image, out.pixels.data() + i * out.sample_bytes());
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (i < error_index) {
          error_index = i;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t wanted = options.threads > 0 ? options.threads : hardware;
  const int threads = static_cast<int>(std::clamp<std::int64_t>(wanted, 1, out.size));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace partrain::data
