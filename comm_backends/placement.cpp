#include "comm_backends/placement.h"

#include <algorithm>
#include <map>
#include <utility>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
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

std::vector<std::uint8_t> encode_host_layout(const HostLayout& layout) {
  std::vector<std::uint8_t> out;
  const auto put32 = [&out](std::size_t value) {
    const std::size_t at = out.size();
    out.resize(at + 4);
    put_le<std::uint32_t>(out.data() + at, static_cast<std::uint32_t>(value));
  };
  put32(layout.identities.size());
  for (const auto& identity : layout.identities) {
    put32(identity.size());
    out.insert(out.end(), identity.begin(), identity.end());
  }
  // Ranks of one host are mostly consecutive: runs of (host, length) keep the value small
  // whatever the world (one run for a world on one host).
  std::vector<std::pair<int, std::size_t>> runs;
  for (const int host : layout.host_of) {
    if (runs.empty() || runs.back().first != host)
      runs.emplace_back(host, 1);
    else
      ++runs.back().second;
  }
  put32(runs.size());
  for (const auto& [host, length] : runs) {
    put32(static_cast<std::size_t>(host));
    put32(length);
  }
  return out;
}

HostLayout decode_host_layout(const std::vector<std::uint8_t>& bytes, int ranks) {
  std::size_t at = 0;
  const auto get32 = [&]() -> std::uint32_t {
    PARTRAIN_CHECK(at + 4 <= bytes.size(), CommError,
                   "host layout: the published layout is cut short");
    const auto value = get_le<std::uint32_t>(bytes.data() + at);
    at += 4;
    return value;
  };
  std::vector<std::string> hosts(get32());
  for (auto& identity : hosts) {
    const std::uint32_t length = get32();
    PARTRAIN_CHECK(at + length <= bytes.size(), CommError,
                   "host layout: the published layout is cut short");
    identity.assign(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                    bytes.begin() + static_cast<std::ptrdiff_t>(at + length));
    at += length;
  }
  std::vector<std::string> identities;
  const std::uint32_t runs = get32();
  for (std::uint32_t i = 0; i < runs; ++i) {
    const std::uint32_t host = get32();
    const std::uint32_t length = get32();
    PARTRAIN_CHECK(host < hosts.size() && length <= static_cast<std::uint32_t>(ranks) &&
                       identities.size() + length <= static_cast<std::size_t>(ranks),
                   CommError, "host layout: the published layout does not fit ", ranks, " ranks");
    identities.insert(identities.end(), length, hosts[host]);
  }
  PARTRAIN_CHECK(identities.size() == static_cast<std::size_t>(ranks) && at == bytes.size(),
                 CommError, "host layout: the published layout holds ", identities.size(),
                 " ranks, not ", ranks);
  return group_by_host(identities);
}

namespace {

std::string host_key(const std::string& prefix, int rank) { return prefix + std::to_string(rank); }

// After a wait for the layout timed out: the ranks that never published their host (found
// only now, so the exchange itself stays O(W)).
std::string missing_ranks(Store& store, const std::string& prefix, int size) {
  std::vector<int> missing;
  for (int r = 0; r < size && missing.size() < 8; ++r) {
    if (!store.check({host_key(prefix, r)})) missing.push_back(r);
  }
  std::string text;
  for (const int r : missing) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace

HostLayout exchange_host_layout(Store& store, const std::string& prefix, int rank, int size) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "rank ", rank,
                 " is outside a world of ", size);
  const std::string mine = host_identity();
  if (size == 1) return group_by_host({mine});
  store.set(host_key(prefix, rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  const std::string layout_key = prefix + "layout";
  if (rank == 0) {
    // Rank 0 gathers every host and publishes one layout: W reads here and one read on every
    // other rank, where each rank reading every other's would be W*W.
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r) keys.push_back(host_key(prefix, r));
    try {
      store.wait(keys, store.timeout());
    } catch (const CommError& e) {
      throw CommError("host layout: rank(s) " + missing_ranks(store, prefix, size) +
                      " never published their host: " + e.what());
    }
    std::vector<std::string> identities(size);
    identities[0] = mine;
    for (int r = 1; r < size; ++r) {
      const auto theirs = store.get(host_key(prefix, r));
      identities[r].assign(theirs.begin(), theirs.end());
    }
    HostLayout layout = group_by_host(identities);
    store.set(layout_key, encode_host_layout(layout));
    return layout;
  }
  std::vector<std::uint8_t> published;
  try {
    published = store.get(layout_key);
  } catch (const CommError& e) {
    const std::string missing = missing_ranks(store, prefix, size);
    throw CommError("host layout: " +
                    (missing.empty() ? std::string("rank 0 never published the layout")
                                     : "rank(s) " + missing + " never published their host") +
                    ": " + e.what());
  }
  HostLayout layout = decode_host_layout(published, size);
  PARTRAIN_CHECK(layout.identities[layout.host_of[rank]] == mine, CommError,
                 "host layout: rank 0 placed rank ", rank, " on another host than its own");
  return layout;
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
