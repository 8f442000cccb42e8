#include "comm_backends/placement.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/byte_codec.h"
#include "common/cpu_list.h"
#include "common/errors.h"

namespace partrain::comm {

std::size_t HostLayout::largest_host() const {
  std::size_t largest = 0;
  for (const int size : host_sizes) largest = std::max(largest, static_cast<std::size_t>(size));
  return largest;
}

bool HostLayout::shares_cores() const {
  for (std::size_t h = 0; h < host_sizes.size(); ++h) {
    if (shares_cores(static_cast<int>(h))) return true;
  }
  return false;
}

bool HostLayout::shares_cores(int host) const {
  const auto h = static_cast<std::size_t>(host);
  return h < host_sizes.size() && h < host_cpus.size() && host_cpus[h] > 0 &&
         host_sizes[h] > host_cpus[h];
}

int HostLayout::host_of(int rank) const {
  PARTRAIN_CHECK(rank >= 0 && rank < ranks(), UsageError, "rank ", rank, " is outside a layout of ",
                 ranks(), " ranks");
  const auto after = std::upper_bound(runs.begin(), runs.end(), rank,
                                      [](int r, const Run& run) { return r < run.first; });
  return std::prev(after)->host;
}

std::vector<int> HostLayout::members(int host) const {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(host_sizes.at(static_cast<std::size_t>(host))));
  for (const Run& run : runs) {
    if (run.host != host) continue;
    for (int r = run.first; r < run.first + run.count; ++r) out.push_back(r);
  }
  return out;
}

std::vector<int> HostLayout::host_of_each() const {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(ranks()));
  for (const Run& run : runs) out.insert(out.end(), static_cast<std::size_t>(run.count), run.host);
  return out;
}

void HostLayout::append(int host, int count, const std::string& identity) {
  PARTRAIN_CHECK(count >= 1 && host >= 0 && host <= static_cast<int>(identities.size()), Error,
                 "host layout: ", count, " ranks on host ", host, " of ", identities.size());
  if (host == static_cast<int>(identities.size())) {
    identities.push_back(identity);
    host_sizes.push_back(0);
    host_cpus.push_back(0);
    host_shm_room.push_back(kShmRoomUnknown);
  }
  host_sizes[static_cast<std::size_t>(host)] += count;
  if (!runs.empty() && runs.back().host == host) {
    runs.back().count += count;
  } else {
    runs.push_back({ranks(), count, host});
  }
}

HostLayout group_by_host(const std::vector<std::string>& identities) {
  HostLayout layout;
  std::map<std::string, int> index;
  for (const std::string& identity : identities) {
    const auto [it, fresh] = index.emplace(identity, static_cast<int>(layout.host_count()));
    layout.append(it->second, 1, identity);
  }
  return layout;
}

int distinct_cpus(const std::vector<std::string>& lists) {
  std::vector<int> all;
  for (const std::string& list : lists) {
    const std::vector<int> cpus = cpus_of(list);
    if (cpus.empty()) return 0;
    all.insert(all.end(), cpus.begin(), cpus.end());
  }
  std::sort(all.begin(), all.end());
  return static_cast<int>(std::unique(all.begin(), all.end()) - all.begin());
}

HostLayout group_by_host(const std::vector<RankSite>& sites) {
  std::vector<std::string> identities;
  identities.reserve(sites.size());
  for (const RankSite& site : sites) identities.push_back(site.host);
  HostLayout layout = group_by_host(identities);
  std::vector<std::vector<std::string>> lists(layout.host_count());
  for (std::size_t r = 0; r < sites.size(); ++r) {
    lists[static_cast<std::size_t>(layout.host_of(static_cast<int>(r)))].push_back(sites[r].cpus);
  }
  for (std::size_t h = 0; h < lists.size(); ++h) layout.host_cpus[h] = distinct_cpus(lists[h]);
  for (std::size_t r = 0; r < sites.size(); ++r) {
    std::uint64_t& room =
        layout.host_shm_room[static_cast<std::size_t>(layout.host_of(static_cast<int>(r)))];
    room = std::min(room, sites[r].shm_room);
  }
  return layout;
}

namespace {

void put32(std::vector<std::uint8_t>& out, std::size_t value) {
  const std::size_t at = out.size();
  out.resize(at + 4);
  put_le<std::uint32_t>(out.data() + at, static_cast<std::uint32_t>(value));
}

void put_text(std::vector<std::uint8_t>& out, const std::string& text) {
  put32(out, text.size());
  out.insert(out.end(), text.begin(), text.end());
}

// Host identities as the layout holds them: a count, then (length, bytes) each.
void put_identities(std::vector<std::uint8_t>& out, const std::vector<std::string>& identities) {
  put32(out, identities.size());
  for (const auto& identity : identities) put_text(out, identity);
}

void put64(std::vector<std::uint8_t>& out, std::uint64_t value) {
  put32(out, static_cast<std::size_t>(value & 0xffffffffu));
  put32(out, static_cast<std::size_t>(value >> 32));
}

// Every value of the exchange opens with this mark, "PTL" and its format's digit, so
// that ranks running builds that lay the values out differently stop with a message naming the
// rank of the other build instead of misreading its value. Values of builds before the mark
// open with a length or a count, far below it. Format 2: a rank's own value holds a count of
// sites (1) after the mark, as the others do, so that it can hold why the rank stopped (0).
constexpr std::uint32_t kLayoutFormat = 2;
constexpr std::uint32_t kLayoutMark = 0x004c5450u | ('0' + kLayoutFormat) << 24;

void put_mark(std::vector<std::uint8_t>& out) { put32(out, kLayoutMark); }

// A rank's site as its own value and a group's value hold it: the host, the CPUs, the room
// for shared memory.
void put_site(std::vector<std::uint8_t>& out, const RankSite& site) {
  put_text(out, site.host);
  put_text(out, site.cpus);
  put64(out, site.shm_room);
}

// Reads a published value field by field; `what` names it in the CommError of a value that
// is cut short.
class Reader {
 public:
  Reader(const std::vector<std::uint8_t>& bytes, const char* what) : bytes_(bytes), what_(what) {}
  std::uint32_t u32() {
    need(4);
    const auto value = get_le<std::uint32_t>(bytes_.data() + at_);
    at_ += 4;
    return value;
  }
  std::uint64_t u64() {
    const std::uint64_t low = u32();
    return low | std::uint64_t{u32()} << 32;
  }
  std::string text() {
    const std::uint32_t length = u32();
    need(length);
    std::string out(bytes_.begin() + static_cast<std::ptrdiff_t>(at_),
                    bytes_.begin() + static_cast<std::ptrdiff_t>(at_ + length));
    at_ += length;
    return out;
  }
  // A count of items of at least `least_bytes` each that follow: refused when they could not
  // fit in what is left, before anything is made for them.
  std::uint32_t count(std::size_t least_bytes) {
    const std::uint32_t n = u32();
    PARTRAIN_CHECK(n <= (bytes_.size() - at_) / least_bytes, CommError, "host layout: ", what_,
                   " counts ", n, " items in ", bytes_.size() - at_, " bytes");
    return n;
  }
  bool done() const { return at_ == bytes_.size(); }
  // Reads the mark a value opens with; `who` (the rank that published it) runs another build
  // where it is not this build's.
  void mark(const std::string& who) {
    const std::uint32_t mark = bytes_.size() >= 4 ? u32() : 0;
    if (mark == kLayoutMark) return;
    const bool marked = (mark & 0x00ffffffu) == (kLayoutMark & 0x00ffffffu);
    throw CommError("host layout: " + who + " runs another build of partrain (" +
                    (marked ? "layout format " + std::to_string(static_cast<int>(mark >> 24) - '0')
                            : std::string("a layout without a format mark")) +
                    ", this build's " + std::to_string(kLayoutFormat) +
                    "): run the same build on every rank");
  }

 private:
  void need(std::size_t bytes) const {
    PARTRAIN_CHECK(at_ + bytes <= bytes_.size(), CommError, "host layout: ", what_,
                   " is cut short");
  }
  const std::vector<std::uint8_t>& bytes_;
  const char* what_;
  std::size_t at_ = 0;
};

// A leader that stops the exchange (a rank of another build, one that never published)
// publishes why in place of the value the others wait for: the mark, a count of 0 (no group or
// layout holds none), its finding. Where it found a value of another build, they stop at once
// with its reason rather than at their timeout with their own, or with "connection lost" once
// rank 0, the store's host, has gone. Where a rank never published, the leader itself waited the
// timeout, as the others did: they stop with its reason or their own, whichever comes first.
// The failure stays under the prefix: an exchange repeated under it fails the same way.
std::vector<std::uint8_t> failure_value(const std::string& finding) {
  std::vector<std::uint8_t> out;
  put_mark(out);
  put32(out, 0);
  put_text(out, finding);
  return out;
}

// Such a value, read by a rank that waited for it: `finding` is passed on as it is when this
// rank stops in turn.
// `by` is the leader that stopped the exchange, or -1 for a rank's own value: the finding
// names that rank itself, as does a leader's that stopped on an error of its own ("rank 64
// (HOST) stopped: ...", stop_host_layout()).
class PublishedFailure : public CommError {
 public:
  PublishedFailure(int by, std::string finding)
      : CommError("host layout: " + who_stopped(by, finding) + finding),
        finding_(std::move(finding)) {}
  const std::string& finding() const { return finding_; }

 private:
  static std::string who_stopped(int by, const std::string& finding) {
    if (by < 0) return "";
    const std::string rank = "rank " + std::to_string(by);
    return finding.starts_with(rank + " (") ? "" : rank + " stopped the exchange: ";
  }
  std::string finding_;
};

// The count a rank's, group's or layout value opens with after its mark; a count of 0 is a
// failure that `by` published (-1: the rank whose own value it is).
std::uint32_t count_or_failure(Reader& in, int by, std::size_t least_bytes) {
  const std::uint32_t count = in.count(least_bytes);
  if (count == 0) throw PublishedFailure(by, in.text());
  return count;
}

}  // namespace

std::vector<std::uint8_t> encode_host_layout(const HostLayout& layout) {
  std::vector<std::uint8_t> out;
  put_mark(out);
  put_identities(out, layout.identities);
  for (std::size_t h = 0; h < layout.identities.size(); ++h) {
    put32(out, h < layout.host_cpus.size() ? static_cast<std::size_t>(layout.host_cpus[h]) : 0);
    put64(out, h < layout.host_shm_room.size() ? layout.host_shm_room[h] : kShmRoomUnknown);
  }
  // The runs themselves: small whatever the world (one for a world on one host).
  put32(out, layout.runs.size());
  for (const HostLayout::Run& run : layout.runs) {
    put32(out, static_cast<std::size_t>(run.host));
    put32(out, static_cast<std::size_t>(run.count));
  }
  return out;
}

HostLayout decode_host_layout(const std::vector<std::uint8_t>& bytes, int ranks) {
  Reader in(bytes, "the published layout");
  in.mark("rank 0");
  // A length, and CPUs and room below, for each host.
  std::vector<std::string> hosts(count_or_failure(in, 0, 4 + 4 + 8));
  for (auto& identity : hosts) identity = in.text();
  std::vector<std::uint32_t> cpus(hosts.size());
  std::vector<std::uint64_t> rooms(hosts.size());
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    cpus[h] = in.u32();
    rooms[h] = in.u64();
  }
  // The runs as they are (nothing a rank): every rank of a large job decodes this at once.
  // Hosts are renumbered in the order of their lowest rank, as group_by_host() numbers them,
  // whatever order the value lists them in.
  const std::uint32_t runs = in.count(4 + 4);  // a host and a length each
  HostLayout layout;
  std::vector<int> renumbered(hosts.size(), -1);
  for (std::uint32_t i = 0; i < runs; ++i) {
    const std::uint32_t host = in.u32();
    const std::uint32_t length = in.u32();
    PARTRAIN_CHECK(host < hosts.size() && length >= 1 &&
                       length <= static_cast<std::uint32_t>(ranks - layout.ranks()),
                   CommError, "host layout: the published layout does not fit ", ranks, " ranks");
    int& index = renumbered[host];
    if (index < 0) index = static_cast<int>(layout.host_count());
    layout.append(index, static_cast<int>(length), hosts[host]);
    layout.host_cpus[static_cast<std::size_t>(index)] = static_cast<int>(cpus[host]);
    layout.host_shm_room[static_cast<std::size_t>(index)] = rooms[host];
  }
  PARTRAIN_CHECK(layout.ranks() == ranks && in.done(), CommError,
                 "host layout: the published layout holds ", layout.ranks(), " ranks, not ", ranks);
  std::vector<std::string> distinct = layout.identities;
  std::sort(distinct.begin(), distinct.end());
  PARTRAIN_CHECK(std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end(), CommError,
                 "host layout: the published layout names one host twice");
  return layout;
}

namespace {

std::string host_key(const std::string& prefix, int rank) { return prefix + std::to_string(rank); }
std::string group_key(const std::string& prefix, int leader) {
  return prefix + "group/" + std::to_string(leader);
}

// The ranks in [first, last) that never published their host, at most eight. Asked only
// after a wait timed out, so the exchange itself stays O(W).
std::string missing_ranks(Store& store, const std::string& prefix, int first, int last) {
  std::vector<int> missing;
  for (int r = first; r < last && missing.size() < 8; ++r) {
    if (!store.check({host_key(prefix, r)})) missing.push_back(r);
  }
  std::string text;
  for (const int r : missing) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// After a wait for keys of the ranks in [first, last) timed out (`timed_out`): the error
// naming those of them that never published their host, or else saying `otherwise`.
CommError layout_wait_failed(Store& store, const std::string& prefix, int first, int last,
                             const std::string& otherwise, const CommError& timed_out) {
  const std::string missing = missing_ranks(store, prefix, first, last);
  return CommError(
      "host layout: " +
      (missing.empty() ? otherwise : "rank(s) " + missing + " never published their host") + ": " +
      timed_out.what());
}

// The values of keys published by the ranks in [first, last), once all are there (one
// round trip on the tcp store); on a timeout, a CommError naming those of the ranks that
// never published their host, or else `leaders` (the ranks whose group value is missing).
std::vector<std::vector<std::uint8_t>> get_all(Store& store, const std::string& prefix,
                                               const std::vector<std::string>& keys, int first,
                                               int last, const std::string& leaders) {
  try {
    return store.get_many(keys);
  } catch (const CommError& e) {
    throw layout_wait_failed(store, prefix, first, last,
                             "rank(s) " + leaders + " never published their group", e);
  }
}

RankSite read_site(Reader& in) {
  RankSite site;
  site.host = in.text();
  site.cpus = in.text();
  site.shm_room = in.u64();
  return site;
}

// Appends the sites of a group's value, which must hold `count` ranks, to `out`.
void decode_group(const std::vector<std::uint8_t>& bytes, int leader, std::size_t count,
                  std::vector<RankSite>& out) {
  Reader in(bytes, "a group's value");
  in.mark("rank " + std::to_string(leader));
  PARTRAIN_CHECK(count_or_failure(in, leader, 4 + 4 + 8) == count, CommError,
                 "host layout: a group's value holds another number of ranks than ", count);
  for (std::size_t i = 0; i < count; ++i) out.push_back(read_site(in));
  PARTRAIN_CHECK(in.done(), CommError, "host layout: a group's value runs on");
}

// The sites of ranks first..last-1 as their leader (`first`) gathers them: its own, then
// each other's from the store.
std::vector<RankSite> gather_group(Store& store, const std::string& prefix, int first, int last,
                                   const RankSite& mine) {
  std::vector<std::string> keys;
  for (int r = first + 1; r < last; ++r) keys.push_back(host_key(prefix, r));
  std::vector<RankSite> sites;
  sites.reserve(static_cast<std::size_t>(last - first));
  sites.push_back(mine);
  if (keys.empty()) return sites;
  const auto values = get_all(store, prefix, keys, first + 1, last, "");
  for (std::size_t i = 0; i < values.size(); ++i) {
    Reader in(values[i], "a rank's value");
    in.mark("rank " + std::to_string(first + 1 + static_cast<int>(i)));
    PARTRAIN_CHECK(count_or_failure(in, -1, 4 + 4 + 8) == 1, CommError,
                   "host layout: a rank's value holds more than one site");
    sites.push_back(read_site(in));
    PARTRAIN_CHECK(in.done(), CommError, "host layout: a rank's value runs on");
  }
  return sites;
}

int default_fan_in(int size) {
  int root = 1;
  while (root * root < size) ++root;  // ceil(sqrt(size)): at most 46341 turns
  return std::max(kLayoutFanInMin, root);
}

// A leader's part: gathers its group's sites, then (rank % fan_in == 0, not rank 0) sets them as
// one value under `out_key`, or (rank 0) gathers every group's value and sets the layout under
// `out_key`, which it returns.
std::optional<HostLayout> lead_group(Store& store, const std::string& prefix, int rank, int size,
                                     int fan_in, const RankSite& mine, const std::string& out_key) {
  std::vector<RankSite> sites =
      gather_group(store, prefix, rank, std::min(size, rank + fan_in), mine);
  if (rank != 0) {
    std::vector<std::uint8_t> value;
    put_mark(value);
    put32(value, sites.size());
    for (const RankSite& p : sites) put_site(value, p);
    store.set(out_key, value);
    return std::nullopt;
  }
  // Rank 0 holds its own group's hosts; the other leaders' groups come as one value each.
  std::vector<std::string> keys;
  std::string leaders;
  for (int leader = fan_in; leader < size; leader += fan_in) {
    keys.push_back(group_key(prefix, leader));
    leaders += (leaders.empty() ? "" : ", ") + std::to_string(leader);
  }
  sites.reserve(static_cast<std::size_t>(size));
  if (!keys.empty()) {
    const auto groups = get_all(store, prefix, keys, 0, size, leaders);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const int leader = static_cast<int>(g + 1) * fan_in;
      decode_group(groups[g], leader,
                   static_cast<std::size_t>(std::min(size, leader + fan_in) - leader), sites);
    }
  }
  HostLayout layout = group_by_host(sites);
  store.set(out_key, encode_host_layout(layout));
  return layout;
}

}  // namespace

HostLayout exchange_host_layout(Store& store, const std::string& prefix, int rank, int size,
                                int fan_in) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "rank ", rank,
                 " is outside a world of ", size);
  PARTRAIN_CHECK(fan_in >= 0 && fan_in != 1, UsageError, "host layout: a fan-in of ", fan_in);
  if (fan_in == 0) fan_in = default_fan_in(size);
  const RankSite mine{host_identity(), cpu_affinity(), shm_room()};
  if (size == 1) return group_by_host(std::vector<RankSite>{mine});
  std::vector<std::uint8_t> own;
  put_mark(own);
  put32(own, 1);
  put_site(own, mine);
  store.set(host_key(prefix, rank), own);
  const std::string layout_key = prefix + "layout";
  if (rank % fan_in == 0) {
    // What a leader sets, once, for the ranks that wait on it: its group's value, rank 0's
    // layout, or why it stopped.
    const std::string out_key = rank == 0 ? layout_key : group_key(prefix, rank);
    try {
      if (auto layout = lead_group(store, prefix, rank, size, fan_in, mine, out_key)) {
        return *layout;
      }
    } catch (const CommError& e) {
      const auto* published = dynamic_cast<const PublishedFailure*>(&e);
      std::string finding = published != nullptr ? published->finding() : e.what();
      const std::string head = "host layout: ";
      if (published == nullptr && finding.rfind(head, 0) == 0) finding.erase(0, head.size());
      try {
        store.set(out_key, failure_value(finding));
      } catch (const CommError&) {
        // The store is gone too: the others learn of it from the store.
      }
      throw;
    }
  }
  std::vector<std::uint8_t> published;
  try {
    published = store.get(layout_key);
  } catch (const CommError& e) {
    throw layout_wait_failed(store, prefix, 0, size, "rank 0 never published the layout", e);
  }
  HostLayout layout = decode_host_layout(published, size);
  PARTRAIN_CHECK(layout.identities[static_cast<std::size_t>(layout.host_of(rank))] == mine.host,
                 CommError, "host layout: rank 0 placed rank ", rank,
                 " on another host than its own");
  return layout;
}

void stop_host_layout(Store& store, const std::string& prefix, int rank, int size,
                      const std::string& finding) {
  if (size == 1 || store.check({host_key(prefix, rank)})) return;
  const std::vector<std::uint8_t> failure = failure_value(finding);
  // What the ranks that count on it wait for: a leader's value first, then its own.
  if (rank % default_fan_in(size) == 0) {
    store.set(rank == 0 ? prefix + "layout" : group_key(prefix, rank), failure);
  }
  store.set(host_key(prefix, rank), failure);
}

HostLayout layout_on_this_host(int ranks) {
  PARTRAIN_CHECK(ranks >= 1, UsageError, "a layout of ", ranks, " ranks");
  return group_by_host(std::vector<RankSite>(
      static_cast<std::size_t>(ranks), RankSite{host_identity(), cpu_affinity(), shm_room()}));
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

// Note [Binding ranks to cores]
// Where `partrain run` or `partrain bench allreduce` starts several ranks on a host and their
// buffers are in CPU memory, it binds each to cores of its own (launch.bind: auto; the bench's
// --bind auto), as Open MPI's mpirun binds its processes unless told otherwise. Left to the
// scheduler, two busy ranks may share one CPU for milliseconds while another idles: on a 2-CPU
// machine a 4 KiB shm allreduce at W=2 took 10.4-10.7 us in such spells against 1.3 us
// otherwise, and a spell could come back after the ranks had been apart (BENCHMARKS.md, "The
// shm backend: why it had two speeds"). Each rank also runs cores / ranks intra-op threads
// (set_intra_op_threads(), at most as many as it has CPUs), which then stay on its own cores,
// as do its loader threads. The compute probe of `--with-baseline` runs alone and unbound.
//
// Cores, not CPUs: the hardware threads of a core share its execution units and first caches,
// so a core goes to one rank whole (thread_siblings_list names them; Linux often numbers the
// second threads of all cores after the first ones, so neighbouring numbers are not siblings).
// The cores are divided in the order of their lowest CPU, so a rank's cores are neighbours in
// the machine's numbering, usually within one package. With fewer cores than ranks but as many
// hardware threads (two ranks on a virtual machine of one core and two threads), each rank
// gets threads of its own instead, siblings next to each other. Where the ranks outnumber the
// hardware threads, they share them as evenly as they divide (ranks 0 and 1 on the first, ...):
// left to the scheduler, four ranks on two CPUs had slow runs (a 1 MiB shm allgather took
// 194-305 us by run against 185-190 us in every run so bound; asio-ring at W = 8 and 16 up to
// 1.3x slower), and training was level (BENCHMARKS.md, "Reduce-scatter and allgather through
// shared memory, and ranks that share cores"). No binding where
//   * the buffers are on GPUs: a rank's cores should then be near its GPU, which this division
//     does not know;
//   * an engine (torchrun, mpirun, srun) starts the ranks: binding is its business (mpirun's
//     --bind-to, srun's --cpu-bind);
//   * on Windows, where the launcher does not bind (processor groups are not handled).
// The launcher binds each rank between fork and exec, so every thread it starts inherits it.
// It divides the CPUs it may itself run on: two runs started side by side on one machine would
// each divide all of it and pair their ranks up on the same cores, so such runs are given
// CPUs of their own (`taskset -c 0-7 partrain run ...`) or launch.bind: none. So are hosts
// that are network namespaces of one machine: two such hosts of two ranks put both leaders of
// the hierarchical backend on CPU 0, and a 1 MiB allreduce at 10 Gbit/s took 1.66-1.72 ms
// against 1.02-1.07 with a CPU each (bench/multinode/link.sh's HOST_CPUS=split; BENCHMARKS.md,
// "Namespace hosts with CPUs of their own").

std::vector<std::vector<int>> group_into_cores(
    const std::vector<int>& cpus, const std::function<std::string(int cpu)>& siblings) {
  std::vector<int> ascending = cpus;
  std::sort(ascending.begin(), ascending.end());
  ascending.erase(std::unique(ascending.begin(), ascending.end()), ascending.end());
  std::vector<std::vector<int>> cores;
  std::map<std::string, std::size_t> index;  // siblings list -> its core in `cores`
  for (const int cpu : ascending) {
    const std::string key = siblings(cpu);
    if (key.empty()) {
      cores.push_back({cpu});
      continue;
    }
    const auto [it, fresh] = index.emplace(key, cores.size());
    if (fresh) cores.emplace_back();
    cores[it->second].push_back(cpu);
  }
  return cores;
}

std::vector<std::vector<int>> allowed_cores() {
#if defined(__linux__)
  return group_into_cores(cpus_of(cpu_affinity()), [](int cpu) {
    std::string list;
    std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                     "/topology/thread_siblings_list");
    in >> list;
    return list;
  });
#else
  return {};  // the launcher binds on Linux only
#endif
}

std::vector<std::vector<int>> bind_ranks(const std::vector<std::vector<int>>& cores, int ranks) {
  // Whole cores where there are enough; else single hardware threads, core by core.
  std::vector<std::vector<int>> units = cores;
  if (static_cast<std::int64_t>(cores.size()) < ranks) {
    units.clear();
    for (const auto& core : cores) {
      for (const int cpu : core) units.push_back({cpu});
    }
  }
  const auto count = static_cast<std::int64_t>(units.size());
  if (ranks < 2 || count == 0) return {};
  std::vector<std::vector<int>> cpus(static_cast<std::size_t>(ranks));
  if (count < ranks) {  // ranks share hardware threads, as evenly as they divide
    for (std::int64_t r = 0; r < ranks; ++r) cpus[r] = units[r * count / ranks];
    return cpus;
  }
  for (std::int64_t r = 0; r < ranks; ++r) {
    for (std::int64_t u = r * count / ranks; u < (r + 1) * count / ranks; ++u) {
      cpus[r].insert(cpus[r].end(), units[u].begin(), units[u].end());
    }
    std::sort(cpus[r].begin(), cpus[r].end());
  }
  return cpus;
}

bool shares_cpus(const std::vector<std::vector<int>>& binding) {
  std::set<int> seen;
  for (const auto& cpus : binding) {
    for (const int cpu : cpus) {
      if (!seen.insert(cpu).second) return true;
    }
  }
  return false;
}

}  // namespace partrain::comm
