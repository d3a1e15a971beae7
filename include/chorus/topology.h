// Which ranks of a communicator share a node (Communicator::topology()).
#pragma once

#include <vector>

namespace chorus {

// Which ranks share a node. Nodes are numbered 0.. in the order of their lowest rank;
// ranks of a node are numbered 0.. (local ranks) in rank order.
struct Topology {
  int node = 0;         // this rank's node
  int nodes = 1;        // number of nodes
  int local_rank = 0;   // this rank's position among the ranks of its node
  int local_size = 1;   // ranks on this rank's node
  std::vector<int> node_of;                  // node of every rank
  std::vector<std::vector<int>> node_ranks;  // ranks of every node, ascending
  // Every node has the same number of ranks: the shape hierarchical algorithms need
  // (local rank i of node n is rank node_ranks[n][i]).
  bool uniform() const;
};

}  // namespace chorus
