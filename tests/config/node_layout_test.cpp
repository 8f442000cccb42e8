// NodeLayout: the counts of each node of a run, the rank numbering node by node, and the
// message when a list does not fit the run.
#include "trainer/config/node_layout.h"

#include <gtest/gtest.h>

#include "common/errors.h"

namespace partrain {
namespace {

TEST(NodeLayout, OneCountGoesToEveryNode) {
  const NodeLayout nodes = NodeLayout::every_node(2).for_nodes(3, 8, "--nproc-per-node '2'");
  EXPECT_EQ(nodes, NodeLayout::per_node({2, 2, 2}));
  EXPECT_EQ(nodes.nodes(), 3);
  EXPECT_EQ(nodes.world_size(), 6);
  EXPECT_EQ(nodes.first_rank(0), 0);
  EXPECT_EQ(nodes.first_rank(2), 4);
  EXPECT_TRUE(nodes.is_even());
  // A list of one is the same as its count.
  EXPECT_EQ(NodeLayout::per_node({2}).for_nodes(3, 8, "x"), nodes);
  // The default: one rank on one node.
  EXPECT_EQ(NodeLayout().for_nodes(1, 8, "x"), NodeLayout::per_node({1}));
  EXPECT_EQ(NodeLayout().count(), 1);
}

TEST(NodeLayout, AutoTakesTheCountItIsGiven) {
  EXPECT_TRUE(NodeLayout::automatic().is_auto());
  EXPECT_EQ(NodeLayout::automatic().for_nodes(2, 4, "x"), NodeLayout::per_node({4, 4}));
}

TEST(NodeLayout, UnevenNodesNumberTheirRanksNodeByNode) {
  const NodeLayout nodes = NodeLayout::per_node({2, 1, 3}).for_nodes(3, 8, "x");
  EXPECT_FALSE(nodes.is_even());
  EXPECT_EQ(nodes.ranks_on(0), 2);
  EXPECT_EQ(nodes.ranks_on(1), 1);
  EXPECT_EQ(nodes.ranks_on(2), 3);
  EXPECT_EQ(nodes.first_rank(0), 0);
  EXPECT_EQ(nodes.first_rank(1), 2);
  EXPECT_EQ(nodes.first_rank(2), 3);
  EXPECT_EQ(nodes.world_size(), 6);
  EXPECT_EQ(nodes.counts(), (std::vector<int>{2, 1, 3}));
}

TEST(NodeLayout, AListMustNameEveryNodeOfTheRun) {
  try {
    NodeLayout::per_node({2, 1}).for_nodes(3, 8, "launch.nproc_per_node in a.yaml");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "launch.nproc_per_node in a.yaml gives 2 nodes their counts, but the run has 3 "
              "(--nnodes or launch.nnodes): give one count, or one per node");
  }
}

}  // namespace
}  // namespace partrain
