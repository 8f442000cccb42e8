#include "comm_backends/placement.h"

#include <algorithm>
#include <map>
#include <utility>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

std::size_t HostLayout::largest_host() const {
  std::size_t largest = 0;
  for (const auto& ranks : hosts) largest = std::max(largest, ranks.size());
  return largest;
}

HostLayout group_by_host(const std::vector<std::string>& identities) {
  HostLayout layout;
  std::map<std::string, int> index;
  for (std::size_t r = 0; r < identities.size(); ++r) {
    const auto [it, fresh] = index.emplace(identities[r], static_cast<int>(layout.hosts.size()));
    if (fresh) {
      layout.hosts.emplace_back();
      layout.identities.push_back(identities[r]);
    }
    layout.hosts[it->second].push_back(static_cast<int>(r));
    layout.host_of.push_back(it->second);
  }
  return layout;
}

HostLayout exchange_host_layout(Store& store, const std::string& prefix, int rank, int size) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "rank ", rank,
                 " is outside a world of ", size);
  std::vector<std::string> identities(size);
  identities[rank] = host_identity();
  if (size == 1) return group_by_host(identities);
  store.set(prefix + std::to_string(rank),
            std::vector<std::uint8_t>(identities[rank].begin(), identities[rank].end()));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto theirs = store.get(prefix + std::to_string(r));
    identities[r].assign(theirs.begin(), theirs.end());
  }
  return group_by_host(identities);
}

HostLayout layout_on_this_host(int ranks) {
  PARTRAIN_CHECK(ranks >= 1, UsageError, "a layout of ", ranks, " ranks");
  return group_by_host(std::vector<std::string>(ranks, host_identity()));
}

RankHosts::RankHosts(HostLayout layout) : ranks_(layout.ranks()), layout_(std::move(layout)) {}

RankHosts::RankHosts(Store& store, std::string prefix, int rank, int ranks)
    : store_(&store), prefix_(std::move(prefix)), rank_(rank), ranks_(ranks) {
  PARTRAIN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, UsageError, "rank ", rank,
                 " is outside a world of ", ranks);
}

const HostLayout& RankHosts::layout() const {
  if (!layout_) layout_ = exchange_host_layout(*store_, prefix_, rank_, ranks_);
  return *layout_;
}

}  // namespace partrain::comm
