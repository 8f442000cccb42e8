#include "comm_backends/backends/peer_process.h"

#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace partrain::comm {

namespace {

template <typename T>
std::optional<T> number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

#if defined(__linux__)
// The inode of this process's process-id namespace; 0 where it cannot be read.
std::uint64_t own_pid_space() {
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) != 0) return 0;
  return static_cast<std::uint64_t>(ns.st_ino);
}

// /proc/PID/stat as its fields from the state on ("S", ppid, ...): field N of proc(5) is
// fields[N - 3]. The name before them, in parentheses, may hold spaces and parentheses, so
// the fields start after the last ')'. Empty where the process is gone (or hidden).
std::vector<std::string> stat_fields(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  const auto close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

constexpr std::size_t kStateField = 0;        // proc(5) field 3
constexpr std::size_t kUserTimeField = 11;    // field 14, utime (ticks)
constexpr std::size_t kSystemTimeField = 12;  // field 15, stime (ticks)
constexpr std::size_t kStartField = 19;       // field 22, starttime (ticks after boot)

std::uint64_t field_number(const std::vector<std::string>& fields, std::size_t i) {
  if (i >= fields.size()) return 0;
  return number<std::uint64_t>(fields[i]).value_or(0);
}

// The kernel function the process waits in, where the kernel names it ("0" or nothing where it
// hides addresses from this user).
std::string wait_channel(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/wchan");
  std::string name;
  in >> name;
  return name == "0" ? "" : name;
}

const std::string kEnded =
    "has ended without saying why: a signal such as SIGKILL, or the kernel's out-of-memory "
    "killer (its engine's log or `dmesg` may say which)";
#endif

}  // namespace

namespace {

ProcessMark read_this_process() {
  ProcessMark mark;
#if defined(_WIN32)
  mark.pid = static_cast<std::int64_t>(GetCurrentProcessId());
#else
  mark.pid = static_cast<std::int64_t>(::getpid());
  mark.user = static_cast<std::int64_t>(::getuid());
#endif
#if defined(__linux__)
  mark.started = field_number(stat_fields("self"), kStartField);
  mark.kernel = kernel_identity();
  mark.pid_space = own_pid_space();
#endif
  return mark;
}

}  // namespace

ProcessMark this_process() {
  // Read once a process: the ranks of `bench rendezvous` are threads of a few processes, and a
  // forked child has a mark of its own (a new pid, a new start time).
  static std::mutex mutex;
  static std::optional<ProcessMark> kept;
  std::lock_guard<std::mutex> lock(mutex);
#if defined(_WIN32)
  const auto pid = static_cast<std::int64_t>(GetCurrentProcessId());
#else
  const auto pid = static_cast<std::int64_t>(::getpid());
#endif
  if (!kept || kept->pid != pid) kept = read_this_process();
  return *kept;
}

std::string encode_process_mark(const ProcessMark& mark) {
  return "pid=" + std::to_string(mark.pid) + " started=" + std::to_string(mark.started) +
         " kernel=" + mark.kernel + " pidns=" + std::to_string(mark.pid_space) +
         " uid=" + std::to_string(mark.user);
}

std::optional<ProcessMark> decode_process_mark(std::string_view text) {
  ProcessMark mark;
  int seen = 0;  // one bit a field
  // Reads `value` into `field` as a number; false where it is none.
  const auto read = [](std::string_view value, auto& field) {
    const auto parsed = number<std::remove_reference_t<decltype(field)>>(value);
    if (parsed) field = *parsed;
    return parsed.has_value();
  };
  while (!text.empty()) {
    const auto space = text.find(' ');
    const std::string_view item = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    const auto equals = item.find('=');
    if (equals == std::string_view::npos) return std::nullopt;
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    bool ok = true;
    if (key == "pid") {
      ok = read(value, mark.pid), seen |= 1;
    } else if (key == "started") {
      ok = read(value, mark.started), seen |= 2;
    } else if (key == "kernel") {
      mark.kernel = std::string(value), seen |= 4;
    } else if (key == "pidns") {
      ok = read(value, mark.pid_space), seen |= 8;
    } else if (key == "uid") {
      ok = read(value, mark.user), seen |= 16;
    }  // a field of a later build: skipped
    if (!ok) return std::nullopt;
  }
  if (seen != 31) return std::nullopt;
  return mark;
}

std::string process_key(int rank) { return "ranks/process/" + std::to_string(rank); }

void publish_process_on_join(StoreOptions& options, int rank) {
  const std::string text = encode_process_mark(this_process());
  options.join_key = process_key(rank);
  options.join_value.assign(text.begin(), text.end());
}

std::optional<std::string> look_at_process(const ProcessMark& mark,
                                           std::chrono::milliseconds window) {
#if defined(__linux__)
  const ProcessMark mine = this_process();
  if (mark.kernel.empty() || mark.kernel != mine.kernel || mark.pid_space == 0 ||
      mark.pid_space != mine.pid_space || mark.pid <= 0 || mark.started == 0) {
    return std::nullopt;
  }
  const std::string pid = std::to_string(mark.pid);
  // Gone, or another process that was given its id since.
  const auto gone = [&](const std::vector<std::string>& fields) {
    return fields.empty() || field_number(fields, kStartField) != mark.started;
  };
  const std::vector<std::string> first = stat_fields(pid);
  if (gone(first)) {
    // Another user's processes may be hidden from this one (/proc mounted with hidepid).
    if (first.empty() && mark.user != mine.user) return std::nullopt;
    return kEnded;
  }
  // Bounded by `window`: one sleep between two readings of its CPU time.
  const auto started_watching = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(window);
  const double watched =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_watching).count();
  const std::vector<std::string> second = stat_fields(pid);
  if (gone(second)) return kEnded;
  const std::string state = second[kStateField];
  if (state == "Z" || state == "X" || state == "x") return kEnded;  // its parent has yet to reap it
  if (state == "T") {
    return "is stopped (SIGSTOP or SIGTSTP): `kill -CONT " + pid + "` resumes it";
  }
  if (state == "t") return "is stopped by a debugger or tracer";
  if (state == "D") {
    const std::string channel = wait_channel(pid);
    return "is blocked in the kernel, uninterruptibly (disk or network file system I/O, or a "
           "device)" +
           (channel.empty() ? std::string() : ", in " + channel);
  }
  const auto busy = [](const std::vector<std::string>& fields) {
    return field_number(fields, kUserTimeField) + field_number(fields, kSystemTimeField);
  };
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  const std::uint64_t used = busy(second) >= busy(first) ? busy(second) - busy(first) : 0;
  const double share =
      ticks_per_second > 0 && watched > 0
          ? static_cast<double>(used) / static_cast<double>(ticks_per_second) / watched
          : 0.0;
  const std::string percent = std::to_string(static_cast<int>(share * 100 + 0.5)) + "%";
  if (share >= 0.5) {
    return "is running, using " + percent +
           " of a CPU: busy with something other than this collective (a long computation, a "
           "loop)";
  }
  if (share < 0.05) {
    return "is alive but idle (" + percent +
           " of a CPU): waiting on something other than this collective (another collective, a "
           "lock, its data)";
  }
  return "is alive, using " + percent + " of a CPU";
#else
  (void)mark;
  (void)window;
  return std::nullopt;
#endif
}

std::optional<std::string> look_at_rank_process(Store& store, int rank,
                                                std::chrono::milliseconds bound) {
  try {
    const auto published = try_get(store, process_key(rank), bound);
    if (!published) return std::nullopt;
    const auto mark = decode_process_mark(
        std::string_view(reinterpret_cast<const char*>(published->data()), published->size()));
    if (!mark) return std::nullopt;
    const auto seen = look_at_process(*mark);
    if (!seen) return std::nullopt;
    return "rank " + std::to_string(rank) + " (pid " + std::to_string(mark->pid) +
           ", this machine) " + *seen;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace partrain::comm
