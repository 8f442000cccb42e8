#include "trainer/config/node_layout.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <numeric>
#include <utility>

#include "common/errors.h"

namespace partrain {

NodeLayout NodeLayout::every_node(int count) { return NodeLayout(Kind::kEveryNode, {count}); }

NodeLayout NodeLayout::automatic() { return NodeLayout(Kind::kAuto, {}); }

NodeLayout NodeLayout::per_node(std::vector<int> counts) {
  return NodeLayout(Kind::kPerNode, std::move(counts));
}

int NodeLayout::count() const {
  assert(kind_ == Kind::kEveryNode);
  return counts_.front();
}

const std::vector<int>& NodeLayout::counts() const {
  assert(kind_ == Kind::kPerNode);
  return counts_;
}

NodeLayout NodeLayout::for_nodes(int nnodes, int auto_count, const std::string& source) const {
  if (kind_ == Kind::kAuto) return per_node(std::vector<int>(nnodes, auto_count));
  if (counts_.size() == 1) return per_node(std::vector<int>(nnodes, counts_.front()));
  PARTRAIN_CHECK(static_cast<int>(counts_.size()) == nnodes, UsageError, source, " gives ",
                 counts_.size(), " nodes their counts, but the run has ", nnodes,
                 " (--nnodes or launch.nnodes): give one count, or one per node");
  return per_node(counts_);
}

int NodeLayout::ranks_on(int node) const {
  assert(kind_ == Kind::kPerNode && node >= 0 && node < nodes());
  return counts_[node];
}

int NodeLayout::first_rank(int node) const {
  assert(kind_ == Kind::kPerNode && node >= 0 && node <= nodes());
  return std::accumulate(counts_.begin(), counts_.begin() + node, 0);
}

std::int64_t NodeLayout::world_size() const {
  assert(kind_ == Kind::kPerNode);
  return std::accumulate(counts_.begin(), counts_.end(), std::int64_t{0});
}

bool NodeLayout::is_even() const {
  assert(kind_ == Kind::kPerNode);
  return std::adjacent_find(counts_.begin(), counts_.end(), std::not_equal_to<>()) == counts_.end();
}

}  // namespace partrain
