#include "comm_backends/store/file_store.h"

#include <atomic>
#include <cstdint>
#include <fstream>
#include <random>
#include <thread>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/hash.h"

namespace partrain::comm {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Keys may hold '/', ':' and other characters a filesystem dislikes; hex-encode those.
std::string encode_key(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : key) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string token_directory(const std::string& token) {
  const std::uint64_t hash = fnv1a_64(token);  // stable across platforms and builds
  static const char kHex[] = "0123456789abcdef";
  std::string name = "run-";
  for (int shift = 60; shift >= 0; shift -= 4) name += kHex[(hash >> shift) & 15];
  return name;
}

// Unique per process and call: session ids and nonces.
std::string unique_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t process_salt = std::random_device{}();
  return std::to_string(process_salt) + "." + std::to_string(counter.fetch_add(1));
}

#ifdef _WIN32
constexpr bool kReplaceRefusedWhileOpen = true;
#else
constexpr bool kReplaceRefusedWhileOpen = false;
#endif

// Sleeps a little longer each time, so waiting on a slow peer costs little CPU.
// `cap` bounds the sleep: waits for a peer use the default; the add() lock, held for a few
// microseconds at a time, uses a short cap, or a waiter would keep sleeping through the
// moments it is free while the thread that just released it takes it again.
class Backoff {
 public:
  explicit Backoff(std::chrono::microseconds cap = std::chrono::microseconds(20000)) : cap_(cap) {}
  void pause(Clock::time_point deadline) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(delay_, left));
    delay_ = std::min(delay_ * 2, cap_);
  }

 private:
  std::chrono::microseconds delay_{200};
  std::chrono::microseconds cap_;
};

}  // namespace

FileStore::FileStore(const fs::path& directory, const StoreOptions& options)
    : directory_(options.token.empty() ? directory : directory / token_directory(options.token)),
      timeout_(options.timeout) {
  std::error_code ec;
  fs::create_directories(directory_, ec);
  PARTRAIN_CHECK(fs::is_directory(directory_), UsageError, "file store: cannot create directory '",
                 directory_.string(), "'", ec ? ": " + ec.message() : std::string());
  if (options.world_size > 1) open_session(options.rank, options.world_size);
}

// Note [File store sessions]
// A rendezvous directory outlives its run: a run that was killed leaves counters, addresses
// and add() lock folders, and the next run with the same directory (and token) would read
// them as its own. So the ranks of a run first agree on a session folder of their own:
//   rank r > 0  writes join/r = a fresh nonce, again and again (rank 0 may delete it), until
//               the key "session" names a session and lists r's nonce at line r
//   rank 0      removes what earlier runs left (only names this store makes), waits for
//               join/1..join/W-1, makes session-ID and writes "session" = ID + the nonces
// A stale "session" lists stale nonces, which no live rank accepts; a stale join/r is gone
// after rank 0's clean-up, so what rank 0 reads was written by this run's rank r. Every key
// then lives in session-ID, which no earlier run has seen.
void FileStore::open_session(int rank, int world_size) {
  const fs::path base = directory_;
  const auto deadline = Clock::now() + timeout_;
  const auto join_key = [](int r) { return "join/" + std::to_string(r); };
  Backoff backoff(std::chrono::microseconds(50000));
  if (rank == 0) {
    remove_stale_entries(base);
    std::vector<std::string> nonces(world_size);
    for (int r = 1; r < world_size; ++r) {
      std::vector<std::uint8_t> value;
      while (!try_read(join_key(r), value)) {
        if (Clock::now() >= deadline) {
          std::string missing;
          for (int m = r; m < world_size; ++m) {
            if (!fs::exists(key_path(join_key(m)))) {
              missing += (missing.empty() ? "" : ", ") + std::to_string(m);
            }
          }
          throw CommError("file store " + base.string() + ": rank" +
                          (missing.find(',') != std::string::npos ? "s " : " ") + missing +
                          " did not join within " + std::to_string(timeout_.count()) + " ms");
        }
        backoff.pause(deadline);
      }
      nonces[r].assign(value.begin(), value.end());
    }
    std::string id = unique_suffix();
    for (char& c : id) c = c == '.' ? '-' : c;
    const fs::path session = base / ("session-" + id);
    std::error_code ec;
    fs::create_directory(session, ec);
    PARTRAIN_CHECK(!ec, CommError, "file store: cannot create '", session.string(),
                   "': ", ec.message());
    std::string record = id;
    for (int r = 1; r < world_size; ++r) record += "\n" + nonces[r];
    write_atomically(key_path("session"), std::vector<std::uint8_t>(record.begin(), record.end()));
    directory_ = session;
    return;
  }
  const std::string nonce = unique_suffix() + "." + std::to_string(std::random_device{}());
  const std::vector<std::uint8_t> nonce_bytes(nonce.begin(), nonce.end());
  for (;;) {
    try {
      write_atomically(key_path(join_key(rank)), nonce_bytes);
    } catch (const CommError&) {
      // Rank 0 removed the temp file while cleaning up: the next round writes it again.
    }
    std::vector<std::uint8_t> value;
    if (try_read("session", value)) {
      std::vector<std::string> lines(1);
      for (const std::uint8_t c : value) {
        if (c == '\n')
          lines.emplace_back();
        else
          lines.back() += static_cast<char>(c);
      }
      if (static_cast<int>(lines.size()) == world_size && lines[rank] == nonce) {
        directory_ = base / ("session-" + lines[0]);
        return;
      }
    }
    PARTRAIN_CHECK(Clock::now() < deadline, CommError, "file store ", base.string(),
                   ": rank 0 did not open this run's session within ", timeout_.count(),
                   " ms (is rank 0 running, with the same rendezvous directory and run token?)");
    backoff.pause(deadline);
  }
}

// Only names this store makes: the directory may be one the user keeps other things in.
void FileStore::remove_stale_entries(const fs::path& base) {
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("k_", 0) == 0 || name.rfind("session-", 0) == 0) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
}

fs::path FileStore::key_path(const std::string& key) const {
  PARTRAIN_CHECK(!key.empty(), UsageError, "file store: empty key");
  return directory_ / ("k_" + encode_key(key));
}

void FileStore::write_atomically(const fs::path& path,
                                 const std::vector<std::uint8_t>& value) const {
  // No fsync here, unlike common/atomic_file.h: rendezvous keys live for one run, and a sync
  // per key would cost milliseconds on every rendezvous step.
  const fs::path temp = temp_path_for(path.string());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    PARTRAIN_CHECK(out.good(), CommError, "file store: cannot write '", temp.string(), "'");
    out.write(reinterpret_cast<const char*>(value.data()),
              static_cast<std::streamsize>(value.size()));
    out.close();
    PARTRAIN_CHECK(out.good(), CommError, "file store: write to '", temp.string(), "' failed");
  }
  // rename replaces an existing file atomically (MoveFileEx on Windows). Windows refuses to
  // replace a file that a reader has open (a sharing violation, reported as permission
  // denied); readers hold a key file for one read only, so there the refusal is retried until
  // the timeout. Elsewhere the first attempt decides.
  const auto deadline = Clock::now() + timeout_;
  Backoff backoff;
  std::error_code ec;
  for (fs::rename(temp, path, ec); ec; fs::rename(temp, path, ec)) {
    if (!kReplaceRefusedWhileOpen || ec != std::errc::permission_denied ||
        Clock::now() >= deadline) {
      const std::string reason = ec.message();
      fs::remove(temp, ec);
      throw CommError("file store: cannot rename into '" + path.string() + "': " + reason);
    }
    backoff.pause(deadline);
  }
}

bool FileStore::try_read(const std::string& key, std::vector<std::uint8_t>& value) const {
  std::ifstream in(key_path(key), std::ios::binary);
  if (!in.is_open()) return false;
  value.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

void FileStore::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  write_atomically(key_path(key), value);
}

std::vector<std::uint8_t> FileStore::get(const std::string& key) {
  const auto deadline = Clock::now() + timeout_;
  std::vector<std::uint8_t> value;
  Backoff backoff;
  while (!try_read(key, value)) {
    PARTRAIN_CHECK(Clock::now() < deadline, CommError, "file store: key '", key,
                   "' did not appear in ", directory_.string(), " within ", timeout_.count(),
                   " ms");
    backoff.pause(deadline);
  }
  return value;
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  const fs::path lock = key_path(key).string() + ".lock";
  const auto deadline = Clock::now() + timeout_;
  Backoff backoff(std::chrono::microseconds(2000));
  std::error_code ec;
  while (!fs::create_directory(lock, ec)) {
    PARTRAIN_CHECK(Clock::now() < deadline, CommError, "file store: lock '", lock.string(),
                   "' held for more than ", timeout_.count(),
                   " ms (a process died holding it? remove it)");
    backoff.pause(deadline);
  }
  std::int64_t value = 0;
  try {
    std::vector<std::uint8_t> bytes;
    if (try_read(key, bytes)) {
      const std::string text(bytes.begin(), bytes.end());
      try {
        value = std::stoll(text);
      } catch (const std::exception&) {
        throw CommError("file store: key '" + key + "' does not hold an integer");
      }
    }
    value += delta;
    const std::string text = std::to_string(value);
    write_atomically(key_path(key), std::vector<std::uint8_t>(text.begin(), text.end()));
  } catch (...) {
    fs::remove(lock, ec);
    throw;
  }
  fs::remove(lock, ec);
  return value;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    std::error_code ec;
    if (!fs::exists(key_path(key), ec)) return false;
  }
  return true;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (const auto& key : keys) {
        std::error_code ec;
        if (!fs::exists(key_path(key), ec)) missing += (missing.empty() ? "" : ", ") + key;
      }
      throw CommError("file store: keys missing after " + std::to_string(timeout.count()) +
                      " ms in " + directory_.string() + ": " + missing);
    }
    backoff.pause(deadline);
  }
}

}  // namespace partrain::comm
