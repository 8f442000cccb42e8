#include "comm_backends/shm/host_identity.h"

#include <boost/asio/ip/host_name.hpp>
#include <charconv>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <system_error>
#include <type_traits>
#include <vector>

#include "common/cpu_list.h"
#include "common/process_state.h"

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <sys/stat.h>
#include <sys/statvfs.h>
#endif

namespace partrain::comm {
namespace {

#if !defined(_WIN32)
// The kernel's boot id, empty where it cannot be read.
std::string boot_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  boot >> id;
  return id;
}

// The inode of the namespace at the first of `paths` that exists; 0 where none does.
std::uint64_t namespace_inode(std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    struct stat ns {};
    if (::stat(path, &ns) == 0) return static_cast<std::uint64_t>(ns.st_ino);
  }
  return 0;
}

// " NAME inode" for the namespace at the first of `paths` that exists, else empty.
std::string namespace_of(const char* name, std::initializer_list<const char*> paths) {
  const std::uint64_t inode = namespace_inode(paths);
  return inode == 0 ? std::string() : std::string(" ") + name + " " + std::to_string(inode);
}
#endif

}  // namespace

std::string cpu_affinity() {
#if defined(_WIN32)
  // The process's processor group only: a process runs in one group unless it asks for more.
  DWORD_PTR process = 0, system = 0;
  if (GetProcessAffinityMask(GetCurrentProcess(), &process, &system) == 0) return {};
  std::vector<int> allowed;
  for (int cpu = 0; cpu < static_cast<int>(sizeof(DWORD_PTR) * 8); ++cpu) {
    if (((process >> cpu) & 1) != 0) allowed.push_back(cpu);
  }
  return cpu_list(allowed);
#else
  return cpu_list(affinity_of(0));
#endif
}

std::string host_identity() {
  boost::system::error_code ec;
  std::string identity = boost::asio::ip::host_name(ec);
  if (ec) identity = "unknown-host";
#if !defined(_WIN32)
  const std::string boot = boot_id();
  if (!boot.empty()) identity += " boot " + boot;
  identity += namespace_of("netns", {"/proc/thread-self/ns/net", "/proc/self/ns/net"});
#endif
  return identity;
}

std::uint64_t pid_namespace() {
#if !defined(_WIN32)
  return namespace_inode({"/proc/self/ns/pid"});
#else
  return 0;
#endif
}

std::string kernel_identity() {
#if !defined(_WIN32)
  return boot_id();
#else
  return {};
#endif
}

namespace {

std::string read_steady_clock_identity() {
#if !defined(_WIN32)
  const std::string boot = boot_id();
  if (!boot.empty()) return "boot " + boot + namespace_of("timens", {"/proc/self/ns/time"});
#endif
  boost::system::error_code ec;
  const std::string name = boost::asio::ip::host_name(ec);
  return ec ? std::string() : "host " + name;  // empty: shared with nobody
}

}  // namespace

std::string steady_clock_identity() {
  // A process's boot never changes and partrain never moves itself to another time
  // namespace: read once, as every store client asks for it.
  static const std::string identity = read_steady_clock_identity();
  return identity;
}

std::uint64_t shm_room() {
#if defined(__linux__)
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return kShmRoomUnknown;
  return static_cast<std::uint64_t>(fs.f_bavail) * static_cast<std::uint64_t>(fs.f_frsize);
#else
  return kShmRoomUnknown;
#endif
}

namespace {

template <typename T>
std::optional<T> number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

#if defined(_WIN32)
// The host name and the moment this Windows booted (SystemTimeOfDayInformation's BootTime, one
// value for every process of the boot), or empty where the system does not say: what tells two
// processes' ids apart from ids of another machine or boot.
std::string windows_boot() {
  using Query = LONG(WINAPI*)(ULONG, PVOID, ULONG, PULONG);
  const HMODULE ntdll = GetModuleHandleW(L"ntdll.dll");
  const FARPROC found =
      ntdll != nullptr ? GetProcAddress(ntdll, "NtQuerySystemInformation") : nullptr;
  if (found == nullptr) return {};
  Query query = nullptr;
  static_assert(sizeof query == sizeof found);
  std::memcpy(&query, &found, sizeof query);  // a cast between function types would warn
  struct TimeOfDay {                          // SYSTEM_TIMEOFDAY_INFORMATION
    LARGE_INTEGER boot_time, current_time, time_zone_bias;
    ULONG time_zone_id, reserved;
    ULONGLONG boot_time_bias, sleep_time_bias;
  } day{};
  constexpr ULONG kSystemTimeOfDayInformation = 3;
  if (query(kSystemTimeOfDayInformation, &day, sizeof day, nullptr) != 0) return {};
  boost::system::error_code ec;
  std::string name = boost::asio::ip::host_name(ec);
  if (ec || day.boot_time.QuadPart == 0) return {};
  // One word: the mark's fields are separated by spaces.
  for (char& c : name) {
    if (c == ' ' || c == '\t') c = '_';
  }
  return "windows:" + name + ":boot:" + std::to_string(day.boot_time.QuadPart);
}
#endif

ProcessMark read_this_process() {
  ProcessMark mark;
  mark.pid = current_process_id();
  mark.user = current_user_id();
  mark.started = process_start_ticks(mark.pid);  // each of these empty where not known
#if defined(_WIN32)
  // One process-id space for the whole system.
  mark.kernel = windows_boot();
  mark.pid_space = 1;
#else
  mark.kernel = kernel_identity();
  mark.pid_space = pid_namespace();
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
  if (!kept || kept->pid != current_process_id()) kept = read_this_process();
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
      ok = read(value, mark.pid);
      seen |= 1;
    } else if (key == "started") {
      ok = read(value, mark.started);
      seen |= 2;
    } else if (key == "kernel") {
      mark.kernel = std::string(value);
      seen |= 4;
    } else if (key == "pidns") {
      ok = read(value, mark.pid_space);
      seen |= 8;
    } else if (key == "uid") {
      ok = read(value, mark.user);
      seen |= 16;
    }  // a field of a later build: skipped
    if (!ok) return std::nullopt;
  }
  if (seen != 31) return std::nullopt;
  return mark;
}

std::optional<ProcessState> watch_marked_process(const ProcessMark& mark,
                                                 std::chrono::milliseconds window) {
  const ProcessMark mine = this_process();
  if (mark.kernel.empty() || mark.kernel != mine.kernel || mark.pid_space == 0 ||
      mark.pid_space != mine.pid_space || mark.pid <= 0 || mark.started == 0) {
    return std::nullopt;
  }
  // Another user's processes may be hidden from this one (/proc mounted with hidepid): one that
  // cannot be seen at all is not known to have ended.
  if (mark.user != mine.user && process_start_ticks(mark.pid) == 0) return std::nullopt;
  return watch_process(mark.pid, mark.started, window);
}

std::optional<std::string> look_at_process(const ProcessMark& mark,
                                           std::chrono::milliseconds window) {
  const auto state = watch_marked_process(mark, window);
  if (!state) return std::nullopt;
  return describe_process_state(*state, mark.pid);
}

}  // namespace partrain::comm
