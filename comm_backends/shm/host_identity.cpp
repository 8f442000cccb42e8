#include "comm_backends/shm/host_identity.h"

#include <boost/asio/ip/host_name.hpp>
#include <fstream>
#include <initializer_list>
#include <system_error>
#include <vector>

#include "common/cpu_list.h"

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

}  // namespace partrain::comm
