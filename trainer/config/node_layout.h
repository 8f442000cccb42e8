// defines: NodeLayout — how many ranks each node of a run starts, and the rank numbering that
// follows from it. LibTorch-free and YAML-free: the config (launch.nproc_per_node),
// `partrain run --nproc-per-node` and the launcher (cli/launcher.h) share it.
//
// Before the number of nodes is known a layout is one of three things: one count for every
// node, `auto` (one rank per GPU, settled by `partrain run`), or one count per node in
// node-rank order. for_nodes() turns it into one count per node for a run of N nodes, which
// is what the launcher takes. Ranks are numbered node by node:
//
//   [2, 1]   node 0: ranks 0, 1    node 1: rank 2    world size 3
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace partrain {

class NodeLayout {
 public:
  // One rank on every node.
  NodeLayout() = default;
  static NodeLayout every_node(int count);
  static NodeLayout automatic();
  static NodeLayout per_node(std::vector<int> counts);

  bool is_auto() const { return kind_ == Kind::kAuto; }
  bool is_per_node() const { return kind_ == Kind::kPerNode; }
  // An every_node() layout's count.
  int count() const;
  // A per_node() layout's counts, by node rank.
  const std::vector<int>& counts() const;

  // The layout of a run of `nnodes` nodes, one count per node: an every_node() count, or a
  // list of one, on every node; auto as `auto_count` on every node; a longer list as it is.
  // Throws UsageError, naming `source` (where the layout was given), when the list does not
  // have nnodes entries.
  NodeLayout for_nodes(int nnodes, int auto_count, const std::string& source) const;

  // Of a per_node() layout:
  int nodes() const { return static_cast<int>(counts_.size()); }
  int ranks_on(int node) const;
  int first_rank(int node) const;  // the sum of the counts before `node`
  std::int64_t world_size() const;
  bool is_even() const;  // the same count on every node

  bool operator==(const NodeLayout&) const = default;

 private:
  enum class Kind { kEveryNode, kAuto, kPerNode };
  NodeLayout(Kind kind, std::vector<int> counts) : kind_(kind), counts_(std::move(counts)) {}

  Kind kind_ = Kind::kEveryNode;
  std::vector<int> counts_ = {1};  // every node: one entry; auto: none
};

}  // namespace partrain
