// Direct shared-memory barrier: one phase of the node's ranks.
#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;

void shm_barrier(const Context&, NodeGroup& g) {
  g.expect(wire_code(Collective::kBarrier));
  g.arrive();
  g.wait_all();
}

}  // namespace chorus::algorithms
