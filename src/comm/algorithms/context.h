// What every algorithm gets: the transport, the group, the element type and the
// reduction, scratch memory owned by the communicator, the node's shared-memory group
// where there is one, and the measured thresholds. Algorithms are plain functions over
// this context, one per file, and see no sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "chorus/topology.h"
#include "chorus/types.h"
#include "comm/common/blocks.h"
#include "comm/algorithms/tuning.h"
#include "comm/reduce/reduce.h"
#include "comm/transport/shm/node_group.h"
#include "comm/transport/transport.h"

namespace chorus::algorithms {

// Reusable memory that grows to the largest request and is then kept. Independent
// areas (0, 1, 2) let an algorithm that calls another keep its own buffers.
class Scratch {
 public:
  static constexpr int kAreas = 3;
  uint8_t* get(size_t bytes, int area = 0) {
    std::vector<uint8_t>& b = buffers_[area];
    if (b.size() < bytes) b.resize(bytes);
    return b.data();
  }

 private:
  std::vector<uint8_t> buffers_[kAreas];
};

struct Context {
  transport::Transport& transport;
  int rank;
  int size;
  DataType dtype;
  size_t elem;          // bytes per element
  ReduceFn reduce;      // null for collectives without reduction
  bool average;         // divide the result by size (ReduceOp::kAvg)
  Scratch& scratch;
  size_t segment_bytes;  // pipelining unit of the ring and chain algorithms
  const Topology& topology;  // which ranks share a node
  ReduceOp op = ReduceOp::kSum;               // the reduction `reduce` implements
  transport::shm::NodeGroup* node = nullptr;  // this node's ranks in shared memory, or null
  ReduceManyFn reduce_many = nullptr;  // `reduce` over many sources in one pass, or null
  const Tuning& tuning = kDefaultTuning;  // the cost model's table (CostParams::tuning)
};

// Element ranges of `count` split into `parts` nearly equal blocks (common/blocks.h).
using chorus::block_begin;
using chorus::block_count;

inline int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace chorus::algorithms
