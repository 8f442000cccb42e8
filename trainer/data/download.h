// defines: fetch_cifar100() and the steps it is made of — download_file() (libcurl),
// md5_file() (OpenSSL), extract_archive() (libarchive).
#pragma once

#include <cstdint>
#include <string>

namespace partrain::data {

inline constexpr const char* kCifar100Url =
    "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz";
inline constexpr const char* kCifar100Md5 = "03b5dce01913d631647c71ecec9e9cb8";

struct DownloadOptions {
  double connect_timeout_s = 30.0;
  // The transfer is abandoned when it moves fewer than 1 KiB/s for this long.
  double stall_timeout_s = 60.0;
  double total_timeout_s = 3600.0;
  std::uint64_t max_bytes = 1ull << 30;
};

struct FetchOptions {
  std::string url;  // empty: kCifar100Url. A "#md5=HEX" suffix sets the expected checksum.
  std::string md5;  // empty: from the url's #md5= suffix, else kCifar100Md5
  DownloadOptions download;
};

// Downloads `url` to `path` (temp file + rename). HTTP errors, timeouts and oversize
// transfers throw UsageError naming the url.
void download_file(const std::string& url, const std::string& path,
                   const DownloadOptions& options = {});

// Lower-case hex MD5 of a file's contents.
std::string md5_file(const std::string& path);

// Extracts the regular files and directories of a (compressed) tar archive under `dir`.
// Entries with absolute paths, "..", links or devices are refused (UsageError), and so is
// an archive that unpacks to more than `max_bytes`.
void extract_archive(const std::string& archive_path, const std::string& dir,
                     std::uint64_t max_bytes = 4ull << 30);

// Downloads the CIFAR-100 binary archive, checks its MD5, extracts it and moves the files
// of its cifar-100-binary/ folder (train.bin, test.bin, label names) into `target_dir`,
// checking that train.bin and test.bin are whole numbers of records. Returns target_dir.
std::string fetch_cifar100(const std::string& target_dir, const FetchOptions& options = {});

}  // namespace partrain::data
