// The engine shared by the ring algorithms (allreduce, reduce-scatter, allgather(v)).
//
// The buffer is cut into `size` chunks; chunk c travels around the ring. In
// reduce-scatter steps each rank receives a chunk from its left neighbour, reduces its
// own contribution into it and passes it right; after size-1 steps rank r holds the
// full reduction of chunk r. In allgather steps finished chunks are forwarded.
//
// Every chunk is further cut into segments (Context::segment_bytes), and a segment is
// forwarded as soon as it has been received and reduced, so the ring is a pipeline:
// while one segment is being reduced, later ones are already on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/algorithms/context.h"

namespace chorus::algorithms {

struct RingPlan {
  // Byte length of each chunk; its offsets in `in` (reduce-scatter sources) and `out`
  // (allgather destinations).
  std::vector<size_t> len, in_off, out_off;
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  // Own chunk: where reduce-scatter leaves it (own_dst), and what the first allgather
  // step sends (own_src; equals own_dst after a reduce-scatter).
  uint8_t* own_dst = nullptr;
  const uint8_t* own_src = nullptr;
  int rs_steps = 0;  // size-1 or 0
  int ag_steps = 0;  // size-1 or 0
};

void run_ring(const Context& ctx, const RingPlan& plan);

}  // namespace chorus::algorithms
