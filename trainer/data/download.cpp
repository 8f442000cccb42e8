#include "trainer/data/download.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/temp_dir.h"
#include "trainer/data/cifar_reader.h"

namespace partrain::data {

namespace fs = std::filesystem;

namespace {

struct Sink {
  std::FILE* file = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t max_bytes = 0;
  bool too_big = false;
};

std::size_t write_to_sink(char* data, std::size_t size, std::size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t n = size * count;
  sink->bytes += n;
  if (sink->bytes > sink->max_bytes) {
    sink->too_big = true;
    return 0;  // makes libcurl abort with CURLE_WRITE_ERROR
  }
  return std::fwrite(data, 1, n, sink->file);
}

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Splits "URL#md5=HEX" into the url to request and the checksum it names (empty if none).
std::pair<std::string, std::string> split_checksum(const std::string& url) {
  const auto hash = url.find('#');
  if (hash == std::string::npos) return {url, ""};
  const std::string fragment = url.substr(hash + 1);
  PARTRAIN_CHECK(fragment.rfind("md5=", 0) == 0, UsageError, "url ", url,
                 ": the only fragment understood is #md5=<32 hex digits>");
  return {url.substr(0, hash), fragment.substr(4)};
}

std::string normalise_md5(std::string md5) {
  for (char& ch : md5) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  bool hex = md5.size() == 32;
  for (char ch : md5) hex = hex && std::isxdigit(static_cast<unsigned char>(ch));
  PARTRAIN_CHECK(hex, UsageError, "MD5 checksum '", md5, "' is not 32 hex digits");
  return md5;
}

void check_entry_name(const std::string& archive_path, const std::string& name) {
  const fs::path p(name);
  PARTRAIN_CHECK(!name.empty(), UsageError, archive_path, ": an entry has an empty name");
  PARTRAIN_CHECK(!p.is_absolute() && !p.has_root_name() && !p.has_root_directory(), UsageError,
                 archive_path, ": refusing entry '", name, "' with an absolute path");
  for (const auto& part : p) {
    PARTRAIN_CHECK(part != "..", UsageError, archive_path, ": refusing entry '", name,
                   "' that climbs out of the target directory with '..'");
  }
}

}  // namespace

void download_file(const std::string& url, const std::string& path,
                   const DownloadOptions& options) {
  init_curl_once();
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  PARTRAIN_CHECK(curl != nullptr, Error, "libcurl could not start a transfer");

  const std::string temp = temp_path_for(path);
  Sink sink;
  sink.max_bytes = options.max_bytes;
  sink.file = std::fopen(temp.c_str(), "wb");
  PARTRAIN_CHECK(sink.file != nullptr, UsageError, "cannot write ", temp);

  char error_text[CURL_ERROR_SIZE] = "";
  CURL* h = curl.get();
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(h, CURLOPT_PROTOCOLS, long{CURLPROTO_HTTP | CURLPROTO_HTTPS});
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS, long{CURLPROTO_HTTP | CURLPROTO_HTTPS});
#endif
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options.connect_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options.total_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(options.stall_timeout_s)));
  curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(options.max_bytes));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_to_sink);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "partrain");

  const CURLcode rc = curl_easy_perform(h);
  const bool write_ok = std::fflush(sink.file) == 0;
  std::fclose(sink.file);
  if (rc != CURLE_OK || !write_ok) {
    std::error_code ec;
    fs::remove(temp, ec);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
      throw UsageError(detail::concat("download of ", url, " failed: HTTP status ", status));
    }
    if (sink.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
      throw UsageError(detail::concat("download of ", url, " failed: larger than ",
                                      options.max_bytes, " bytes"));
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      throw UsageError(detail::concat("download of ", url, " timed out (", error_text, ")"));
    }
    throw UsageError(detail::concat("download of ", url, " failed: ",
                                    error_text[0] != '\0' ? error_text : curl_easy_strerror(rc),
                                    write_ok ? "" : " (writing to disk failed)"));
  }
  sync_file(temp);
  commit_file(temp, path);
}

std::string md5_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open for reading");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  PARTRAIN_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_md5(), nullptr) == 1, Error,
                 "OpenSSL cannot compute MD5 here");
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0) {
      EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<std::size_t>(in.gcount()));
    }
  }
  PARTRAIN_CHECK(in.eof(), UsageError, path, ": read failed");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  char byte[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

void extract_archive(const std::string& archive_path, const std::string& dir,
                     std::uint64_t max_bytes) {
  std::unique_ptr<archive, decltype(&archive_read_free)> reader(archive_read_new(),
                                                                archive_read_free);
  archive* a = reader.get();
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  if (archive_read_open_filename(a, archive_path.c_str(), 1 << 16) != ARCHIVE_OK) {
    throw UsageError(
        detail::concat(archive_path, ": not a readable tar archive: ", archive_error_string(a)));
  }
  std::uint64_t total = 0;
  std::vector<char> buffer(1 << 16);
  archive_entry* entry = nullptr;
  for (;;) {
    const int r = archive_read_next_header(a, &entry);
    if (r == ARCHIVE_EOF) break;
    PARTRAIN_CHECK(r == ARCHIVE_OK || r == ARCHIVE_WARN, UsageError, archive_path,
                   ": corrupt archive: ", archive_error_string(a));
    const char* raw_name = archive_entry_pathname(entry);
    const std::string name = raw_name != nullptr ? raw_name : "";
    check_entry_name(archive_path, name);
    const fs::path target = fs::path(dir) / name;
    const auto type = archive_entry_filetype(entry);
    std::error_code ec;
    if (type == AE_IFDIR) {
      fs::create_directories(target, ec);
      PARTRAIN_CHECK(!ec, UsageError, "cannot create ", target.string(), ": ", ec.message());
      continue;
    }
    PARTRAIN_CHECK(type == AE_IFREG, UsageError, archive_path, ": refusing entry '", name,
                   "': only regular files and directories are extracted, not links or devices");
    fs::create_directories(target.parent_path(), ec);
    PARTRAIN_CHECK(!ec, UsageError, "cannot create ", target.parent_path().string(), ": ",
                   ec.message());
    const std::string temp = temp_path_for(target.string());
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      PARTRAIN_CHECK(out, UsageError, "cannot write ", temp);
      for (;;) {
        const la_ssize_t n = archive_read_data(a, buffer.data(), buffer.size());
        if (n == 0) break;
        if (n < 0) {
          out.close();
          fs::remove(temp, ec);
          throw UsageError(detail::concat(archive_path, ": corrupt data in entry '", name,
                                          "': ", archive_error_string(a)));
        }
        total += static_cast<std::uint64_t>(n);
        if (total > max_bytes) {
          out.close();
          fs::remove(temp, ec);
          throw UsageError(detail::concat(archive_path, ": unpacks to more than ", max_bytes,
                                          " bytes; refusing it"));
        }
        out.write(buffer.data(), n);
      }
      PARTRAIN_CHECK(out.flush(), UsageError, "writing ", temp, " failed (disk full?)");
    }
    sync_file(temp);
    commit_file(temp, target.string());
  }
}

namespace {

// The newest write time of `dir` and everything in it.
fs::file_time_type newest_write(const fs::path& dir) {
  std::error_code ec;
  fs::file_time_type newest = fs::last_write_time(dir, ec);
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_time_type t = it->last_write_time(ec);
    if (!ec) newest = std::max(newest, t);
  }
  return newest;
}

// Removes the staging folders (STEM-*) that earlier fetches left in `parent` when they were
// killed, or stopped in a rank's start-up (common/stop_request.h), before their TempDir could
// go. Only those nothing has written to for longer than a fetch can go on: a live fetch
// writes at least every stall_timeout_s while it downloads, and its download ends within
// total_timeout_s; unpacking writes all the time. A fetch on another host, sharing the folder,
// is live by the same rule.
void remove_stale_staging(const fs::path& parent, const std::string& stem,
                          const DownloadOptions& download) {
  const auto lifetime = std::chrono::duration_cast<fs::file_time_type::duration>(
      std::chrono::duration<double>(download.connect_timeout_s + download.total_timeout_s));
  const fs::file_time_type now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(stem + "-") || !it->is_directory(ec)) continue;
    if (now - newest_write(it->path()) <= lifetime) continue;
    std::error_code ignored;
    fs::remove_all(it->path(), ignored);
  }
}

}  // namespace

std::string fetch_cifar100(const std::string& target_dir, const FetchOptions& options) {
  auto [url, url_md5] = split_checksum(options.url.empty() ? kCifar100Url : options.url);
  const std::string expected = normalise_md5(
      !options.md5.empty() ? options.md5 : (!url_md5.empty() ? url_md5 : kCifar100Md5));

  std::error_code ec;
  fs::create_directories(target_dir, ec);
  PARTRAIN_CHECK(!ec, UsageError, "cannot create ", target_dir, ": ", ec.message());
  // Staging next to the target keeps the final renames on one file system; concurrent
  // fetches (one per rank) each use their own and the renames leave whole files.
  fs::path target = fs::path(target_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "data/" -> "data"
  const std::string stem = target.filename().string() + ".download";
  remove_stale_staging(target.has_parent_path() ? target.parent_path() : fs::path("."), stem,
                       options.download);
  const TempDir staging(stem, target.parent_path());

  const std::string archive_file = (staging.path() / "cifar-100-binary.tar.gz").string();
  download_file(url, archive_file, options.download);
  const std::string actual = md5_file(archive_file);
  PARTRAIN_CHECK(actual == expected, UsageError, "checksum mismatch for ", url, ": MD5 ", actual,
                 ", expected ", expected, " (corrupt or wrong download)");

  const fs::path unpacked = staging.path() / "unpacked";
  extract_archive(archive_file, unpacked.string());
  const fs::path source = unpacked / "cifar-100-binary";
  for (const char* name : {"train.bin", "test.bin"}) {
    const fs::path file = source / name;
    PARTRAIN_CHECK(fs::is_regular_file(file, ec), UsageError, url,
                   ": the archive has no cifar-100-binary/", name);
    const std::uintmax_t bytes = fs::file_size(file, ec);
    PARTRAIN_CHECK(!ec && bytes > 0 && bytes % kCifarRecordBytes == 0, UsageError, url,
                   ": cifar-100-binary/", name, " is ", bytes, " bytes, not a whole number of ",
                   kCifarRecordBytes, "-byte records");
  }
  for (const auto& item : fs::directory_iterator(source)) {
    if (!item.is_regular_file()) continue;
    commit_file(item.path().string(), (fs::path(target_dir) / item.path().filename()).string());
  }
  return target_dir;
}

}  // namespace partrain::data
