#include "comm_backends/shm/host_identity.h"

#include "comm_backends/store/store.h"

#include <boost/asio/ip/host_name.hpp>
#include <fstream>
#include <map>
#include <vector>
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

std::vector<std::string> exchange_host_identities(Store& store, const std::string& prefix, int rank,
                                                  int size) {
  std::vector<std::string> identities(size);
  identities[rank] = host_identity();
  store.set(prefix + std::to_string(rank),
            std::vector<std::uint8_t>(identities[rank].begin(), identities[rank].end()));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto theirs = store.get(prefix + std::to_string(r));
    identities[r].assign(theirs.begin(), theirs.end());
  }
  return identities;
}

HostLayout group_by_host(const std::vector<std::string>& identities) {
  HostLayout layout;
  std::map<std::string, int> index;
  for (std::size_t r = 0; r < identities.size(); ++r) {
    const auto [it, fresh] = index.emplace(identities[r], static_cast<int>(layout.hosts.size()));
    if (fresh) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(static_cast<int>(r));
    layout.host_of.push_back(it->second);
  }
  return layout;
}

std::optional<ForeignRank> rank_on_another_host(Store& store, const std::string& prefix, int rank,
                                                int size) {
  const std::string mine = host_identity();
  store.set(prefix + std::to_string(rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto theirs = store.get(prefix + std::to_string(r));
    std::string identity(theirs.begin(), theirs.end());
    if (identity != mine) return ForeignRank{r, std::move(identity)};
  }
  return std::nullopt;
}

}  // namespace partrain::comm
