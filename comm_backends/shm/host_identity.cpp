#include "comm_backends/shm/host_identity.h"

#include <boost/asio/ip/host_name.hpp>
#include <fstream>
#include <system_error>

#if !defined(_WIN32)
#include <sys/stat.h>
#endif

namespace partrain::comm {

std::string host_identity() {
  boost::system::error_code ec;
  std::string identity = boost::asio::ip::host_name(ec);
  if (ec) identity = "unknown-host";
#if !defined(_WIN32)
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) identity += " boot " + boot_id;
  struct stat net {};
  if (::stat("/proc/thread-self/ns/net", &net) == 0 || ::stat("/proc/self/ns/net", &net) == 0) {
    identity += " netns " + std::to_string(static_cast<unsigned long long>(net.st_ino));
  }
#endif
  return identity;
}

namespace {

std::string read_steady_clock_identity() {
#if !defined(_WIN32)
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) {
    std::string identity = "boot " + boot_id;
    struct stat time {};
    if (::stat("/proc/self/ns/time", &time) == 0) {
      identity += " timens " + std::to_string(static_cast<unsigned long long>(time.st_ino));
    }
    return identity;
  }
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
