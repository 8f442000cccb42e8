#include "comm_backends/algorithms/algorithm_choice.h"

// Note [Choosing an algorithm]
// Each algorithm costs, on the busiest rank, some messages in a row (alpha each), some bytes
// through its link (beta each) and some bytes reduced (gamma each); cost_terms() counts them,
// as MPICH's and Open MPI's papers do (Thakur, Rabenseifner and Gropp 2005), with p the largest
// power of two <= W and a fold of two more messages when W is not one:
//
//   allreduce       ring 2(W-1) msgs, 2(W-1)/W n moved; recursive doubling log2 p msgs, n
//                   moved per message; Rabenseifner 2 log2 p msgs, 2(p-1)/p n moved
//   reduce_scatter  ring W-1 msgs; recursive halving log2 p msgs; both (W-1)/W n moved
//   allgather       ring W-1 msgs; recursive doubling log2 p msgs; both (W-1)/W n moved
//   broadcast       chain W-2+C msgs of n/C (C chunks); binomial tree ceil(log2 W) msgs of n
//
// The ring reduces each chunk while the kernel moves the next ones (Note [Ring allreduce]), so
// its reductions add no time here; the others reduce a whole message after it arrived. A call
// takes the algorithm with the least predicted time. beta and gamma of loopback_model() were
// fitted to `partrain bench allreduce --algorithm A` runs of every algorithm at W = 2, 4, 8 on
// one host over loopback TCP (bench/allreduce/model.sh prints the fit and how far it is off;
// BENCHMARKS.md, "Collectives for many ranks"). alpha was fitted too, at 15 us, while a
// listener thread still woke for every message; without those wake-ups the per-message cost
// fell, and with 15 us a 64 KiB allreduce at W=4 stayed with recursive doubling where
// Rabenseifner took 1.26x less time. alpha is now 8 us: over two runs of every algorithm forced
// at W = 2 ... 16, 4 KiB ... 64 MiB (bench/allreduce/choice.py), every alpha from 2 to 13 us
// made the choice take the fastest algorithm or one within 5 % of it at every point, and the
// fits of the two machines measured put alpha / beta at 15-27 KB, 6-11 us with this beta.
//
// Where the ranks run on several hosts, what crosses the links between them counts as well:
// an allreduce's bytes out of the busiest host (HostTraffic, counted by walking each
// algorithm's exchanges over the layout) times beta_link, on top of beta (a byte to another
// host goes through loopback-like processing and then a slower wire). Between two hosts of two
// ranks the ring sends 1.5 buffers out of each host, recursive doubling 2 and Rabenseifner,
// nearest partner first (Note [Nearest partner first]), 1, so allreduces from about 13 KiB
// over such hosts go to Rabenseifner; with one rank per host it moves the crossover from
// recursive doubling to the bandwidth algorithms down (at 4 ranks from about 35 KiB to 18).
// beta_link is assumed, not fitted: 0.8 ns per byte is a 10 Gbit/s link, so that over a faster
// link the choice still leans to fewer bytes between hosts, never to more (the 1 Gbit/s link of
// bench/multinode/link.sh costs 8 ns; the model does not know a link's speed).
// PeerCollectives learns the layout once, by its first automatic allreduce at three ranks or
// more (choice_depends_on_hosts()) if nothing asked before:
// even a small one can depend on it, since at two hosts of 512 ranks recursive doubling's step
// between the hosts sends 512 whole buffers across each link.
//
// Where a host runs more ranks than the CPUs they may run on (HostLayout::shares_cores(): the
// ranks' affinities, exchanged with the layout), an automatic allreduce below
// kSharedCoresRingFrom chooses between recursive doubling and Rabenseifner only. Each of the
// ring's 2(W-1) steps waits for the left neighbour's, and a rank that shares a core is often
// not running when its neighbour's data arrives. Measured with 4, 6 and 8 ranks on two cores,
// five rounds interleaved (BENCHMARKS.md, "Collectives for many ranks"): Rabenseifner forced
// took 1.03-2.5x less time than the ring forced from 64 KiB to 4 MiB; at 16 and 64 MiB the
// two were within 0.86-1.11x of each other, the ring ahead at 4 and 6 ranks (Rabenseifner
// reduces each block after it arrived, and at 6 ranks folds the whole buffer first). No alpha
// or beta expresses the gap: the fitted per-message cost of a rank that shares a core
// (model.sh's kappa, 3-18 us per algorithm) explains about a tenth of it at 1 and 4 MiB, and
// it grows with the message up to a few MiB and then fades. So it is a rule with a size taken from
// those runs (between the 4 and 16 MiB measured), not a term of the model; from that size the model
// chooses as on any host. Every rank applies it alike, since every rank holds the same layout.

#include <algorithm>
#include <cmath>

#include "comm_backends/algorithms/algorithms.h"
#include "common/errors.h"

namespace partrain::comm {

namespace {

struct RequestName {
  AlgorithmRequest request;
  const char* name;
};
constexpr RequestName kRequests[] = {
    {AlgorithmRequest::automatic, "auto"},
    {AlgorithmRequest::ring, "ring"},
    {AlgorithmRequest::recursive_doubling, "recursive_doubling"},
    {AlgorithmRequest::rabenseifner, "rabenseifner"},
};

int floor_log2(int w) {
  int l = 0;
  while ((2 << l) <= w) ++l;
  return l;
}

int ceil_log2(int w) {
  int l = 0;
  while ((1 << l) < w) ++l;
  return l;
}

}  // namespace

std::vector<std::string> algorithm_request_names() {
  std::vector<std::string> names;
  for (const auto& r : kRequests) names.emplace_back(r.name);
  return names;
}

AlgorithmRequest parse_algorithm_request(std::string_view name) {
  std::string known;
  for (const auto& r : kRequests) {
    if (name == r.name) return r.request;
    known += (known.empty() ? "" : ", ") + std::string(r.name);
  }
  throw UsageError("unknown comm algorithm '" + std::string(name) + "' (expected one of " + known +
                   ")");
}

std::string_view algorithm_request_name(AlgorithmRequest request) {
  for (const auto& r : kRequests) {
    if (r.request == request) return r.name;
  }
  return "auto";
}

CostModel loopback_model() { return CostModel{8e-6, 0.4e-9, 0.2e-9, 0.8e-9}; }

HostTraffic host_traffic(const std::vector<int>& host_of) {
  HostTraffic traffic;
  const int world = static_cast<int>(host_of.size());
  const int hosts = world == 0 ? 0 : *std::max_element(host_of.begin(), host_of.end()) + 1;
  traffic.between_hosts = hosts > 1;
  if (!traffic.between_hosts) return traffic;
  // out[h]: buffers sent out of host h; `send` adds what rank `from` sends to rank `to`.
  std::vector<double> out(hosts, 0);
  const auto send = [&](int from, int to, double buffers) {
    if (host_of[from] != host_of[to]) out[host_of[from]] += buffers;
  };
  const auto busiest = [&] {
    const double most = *std::max_element(out.begin(), out.end());
    std::fill(out.begin(), out.end(), 0.0);
    return most;
  };
  const Fold any(0, world);
  // The fold's hand-over and hand-back: the whole buffer each way within each pair.
  const auto fold_both_ways = [&] {
    for (int r = 0; r + 1 < 2 * any.rem; r += 2) {
      send(r, r + 1, 1);
      send(r + 1, r, 1);
    }
  };
  for (int r = 0; r < world; ++r) send(r, (r + 1) % world, 2.0 * (world - 1) / world);
  traffic.ring = busiest();
  fold_both_ways();
  for (int mask = 1; mask < any.pow2; mask <<= 1) {
    for (int nr = 0; nr < any.pow2; ++nr) send(any.last_of(nr), any.last_of(nr ^ mask), 1);
  }
  traffic.recursive_doubling = busiest();
  // Rabenseifner: the halving's step `mask` sends mask / pow2 of the buffer between positions
  // x and x ^ mask; the allgather sends as much back.
  fold_both_ways();
  const auto at = [&](int position) {
    return any.last_of(any.position(position, Positions::nearest_first));
  };
  for (int mask = any.pow2 / 2; mask >= 1; mask >>= 1) {
    for (int x = 0; x < any.pow2; ++x) send(at(x), at(x ^ mask), 2.0 * mask / any.pow2);
  }
  traffic.rabenseifner = busiest();
  return traffic;
}

std::vector<Algorithm> algorithms_for(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::barrier:
      return {Algorithm::recursive_doubling, Algorithm::rabenseifner, Algorithm::ring};
    case CollectiveKind::reduce_scatter:
      return {Algorithm::recursive_halving, Algorithm::ring};
    case CollectiveKind::allgather:
      return {Algorithm::recursive_doubling, Algorithm::ring};
    case CollectiveKind::broadcast:
      return {Algorithm::binomial_tree, Algorithm::ring};
  }
  return {};
}

CostTerms cost_terms(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                     std::size_t chunk_bytes, const HostTraffic* traffic) {
  CostTerms c;
  if (world <= 1) return c;
  const double n = static_cast<double>(bytes), w = world;
  const int l = floor_log2(world);
  const double p = static_cast<double>(1 << l);
  const double fold = world == (1 << l) ? 0 : 1;
  const double ring_share = (w - 1) / w, halving_share = (p - 1) / p;
  switch (kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::barrier:
      if (algorithm == Algorithm::ring) {
        c = {2 * (w - 1), 2 * ring_share * n, 0};
      } else if (algorithm == Algorithm::recursive_doubling) {
        c = {l + 2 * fold, (l + 2 * fold) * n, (l + fold) * n};
      } else {
        c = {2.0 * l + 2 * fold, 2 * halving_share * n + 2 * fold * n,
             halving_share * n + fold * n};
      }
      if (traffic != nullptr && traffic->between_hosts) {
        c.bytes_between_hosts =
            n * (algorithm == Algorithm::ring                 ? traffic->ring
                 : algorithm == Algorithm::recursive_doubling ? traffic->recursive_doubling
                                                              : traffic->rabenseifner);
      }
      break;
    case CollectiveKind::reduce_scatter:
      if (algorithm == Algorithm::ring) {
        c = {w - 1, ring_share * n, 0};
      } else {
        c = {l + 2 * fold, halving_share * n + fold * (n + n / w), halving_share * n + fold * n};
      }
      break;
    case CollectiveKind::allgather:
      if (algorithm == Algorithm::ring) {
        c = {w - 1, ring_share * n, 0};
      } else {
        c = {l + 2 * fold, halving_share * n + fold * (n + n / w), 0};
      }
      break;
    case CollectiveKind::broadcast:
      if (algorithm == Algorithm::ring) {
        const double chunks = std::max(
            1.0, std::ceil(n / static_cast<double>(std::max<std::size_t>(chunk_bytes, 1))));
        c = {w - 2 + chunks, (w - 2 + chunks) / chunks * n, 0};
      } else {
        const double steps = ceil_log2(world);
        c = {steps, steps * n, 0};
      }
      break;
  }
  return c;
}

double predicted_seconds(CollectiveKind kind, Algorithm algorithm, std::size_t bytes, int world,
                         const CostModel& model, std::size_t chunk_bytes,
                         const HostTraffic* traffic) {
  const CostTerms c = cost_terms(kind, algorithm, bytes, world, chunk_bytes, traffic);
  return c.messages * model.alpha + c.bytes_moved * model.beta + c.bytes_reduced * model.gamma +
         c.bytes_between_hosts * model.beta_link;
}

bool choice_depends_on_hosts(CollectiveKind kind, int world, AlgorithmRequest request) {
  return request == AlgorithmRequest::automatic && world >= 3 && kind == CollectiveKind::allreduce;
}

Algorithm choose_algorithm(CollectiveKind kind, std::size_t bytes, int world,
                           AlgorithmRequest request, const CostModel& model,
                           std::size_t chunk_bytes, const HostTraffic* traffic) {
  const bool reduces = kind == CollectiveKind::allreduce || kind == CollectiveKind::barrier;
  switch (request) {
    case AlgorithmRequest::ring:
      return Algorithm::ring;
    case AlgorithmRequest::recursive_doubling:
    case AlgorithmRequest::rabenseifner:
      if (kind == CollectiveKind::reduce_scatter) return Algorithm::recursive_halving;
      if (kind == CollectiveKind::broadcast) return Algorithm::binomial_tree;
      if (kind == CollectiveKind::allgather) return Algorithm::recursive_doubling;
      return request == AlgorithmRequest::rabenseifner && reduces ? Algorithm::rabenseifner
                                                                  : Algorithm::recursive_doubling;
    case AlgorithmRequest::automatic:
      break;
  }
  Algorithm best = Algorithm::ring;
  double best_seconds = 0;
  bool first = true;
  const bool no_ring =
      reduces && traffic != nullptr && traffic->shared_cores && bytes < kSharedCoresRingFrom;
  for (Algorithm a : algorithms_for(kind)) {
    if (no_ring && a == Algorithm::ring) continue;
    const double s = predicted_seconds(kind, a, bytes, world, model, chunk_bytes, traffic);
    if (first || s < best_seconds) {
      best = a;
      best_seconds = s;
      first = false;
    }
  }
  return best;
}

}  // namespace partrain::comm
