#include "comm_backends/shm/host_identity.h"

#include <boost/asio/ip/host_name.hpp>
#include <cerrno>
#include <fstream>
#include <initializer_list>
#include <system_error>
#include <vector>

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <sched.h>
#include <sys/stat.h>
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

// " NAME inode" for the namespace at the first of `paths` that exists, else empty.
std::string namespace_of(const char* name, std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    struct stat ns {};
    if (::stat(path, &ns) == 0) {
      return std::string(" ") + name + " " +
             std::to_string(static_cast<unsigned long long>(ns.st_ino));
    }
  }
  return {};
}
#endif

// "0-3,8" for the CPUs whose entries in `allowed` are set.
std::string as_ranges(const std::vector<bool>& allowed) {
  std::string out;
  const std::size_t n = allowed.size();
  for (std::size_t cpu = 0; cpu < n; ++cpu) {
    if (!allowed[cpu]) continue;
    std::size_t last = cpu;
    while (last + 1 < n && allowed[last + 1]) ++last;
    if (!out.empty()) out += ',';
    out += std::to_string(cpu);
    if (last > cpu) out += '-' + std::to_string(last);
    cpu = last;
  }
  return out;
}

}  // namespace

std::string cpu_affinity() {
#if defined(_WIN32)
  // The process's processor group only: a process runs in one group unless it asks for more.
  DWORD_PTR process = 0, system = 0;
  if (GetProcessAffinityMask(GetCurrentProcess(), &process, &system) == 0) return {};
  std::vector<bool> allowed(sizeof(DWORD_PTR) * 8);
  for (std::size_t cpu = 0; cpu < allowed.size(); ++cpu) {
    allowed[cpu] = ((process >> cpu) & 1) != 0;
  }
  return as_ranges(allowed);
#else
  // The kernel refuses (EINVAL) a set smaller than its own CPU count: try larger ones, up to
  // 65536 CPUs (seven tries).
  for (int cpus = 1024; cpus <= 65536; cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return {};
    const std::size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    const int rc = ::sched_getaffinity(0, size, set);
    const int error = errno;
    std::vector<bool> allowed;
    if (rc == 0) {
      allowed.resize(static_cast<std::size_t>(cpus));
      for (int cpu = 0; cpu < cpus; ++cpu) allowed[cpu] = CPU_ISSET_S(cpu, size, set) != 0;
    }
    CPU_FREE(set);
    if (rc == 0) return as_ranges(allowed);
    if (error != EINVAL) return {};
  }
  return {};
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

}  // namespace partrain::comm
