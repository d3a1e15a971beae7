// Direct shared-memory collectives for the ranks of one node (docs/design.md, "direct
// shared memory"), one per file in this folder; this header holds what several of them
// share. Data goes through each rank's buffers in the group's segment in chunks of at
// most one buffer, alternating between a rank's two buffers (see
// transport/shm/shm_group.h for why that is safe); every chunk starts with "copy in,
// arrive, wait". The algorithms see the node's group only through NodeGroup
// (transport/shm/node_group.h), and take their thresholds from ctx.tuning (tuning.h).
//
// Where the ranks can read each other's memory (NodeGroup::cma()), broadcasts,
// allgathers and reduce-scatters skip the segment from small sizes up: the other ranks
// read the root's data, or each peer's block, straight into their outputs (with
// process_vm_readv), or reduce their block from the peers' inputs, read into
// cache-sized pieces; so do reduces of up to 1 MiB, on the root. Gather, scatter,
// alltoall, alltoallv and allgatherv run here only that way.
//
// Internal to algorithms/shm/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/algorithms/context.h"
#include "comm/transport/shm/node_group.h"

namespace chorus::algorithms::shm {

using transport::shm::NodeGroup;

// memcpy with non-temporal stores where the CPU has them; stream_done() orders them
// before anything this thread publishes later.
void stream_copy(uint8_t* dst, const uint8_t* src, size_t bytes);
void stream_done();

// dst[0, n) = the reduction of source(r) (n elements each) over r = 0 .. p-1, in rank
// order; one rank: a copy. Where the reduction has a many-source kernel and the bytes
// fit ctx.tuning.many_max_bytes, in one pass over up to kManySources sources at a time,
// a further pass starting from the result so far: the same arithmetic in the same
// order as the pairwise fold otherwise taken. dst may be source 0, no other.
template <class Source>
void reduce_ranks(const Context& ctx, int p, size_t n, uint8_t* dst, Source&& source) {
  if (p == 1) {
    if (dst != source(0)) std::memcpy(dst, source(0), n * ctx.elem);
    return;
  }
  if (p == 2 || ctx.reduce_many == nullptr || n * ctx.elem > ctx.tuning.many_max_bytes) {
    ctx.reduce(dst, source(0), source(1), n);
    for (int r = 2; r < p; ++r) ctx.reduce(dst, dst, source(r), n);
    return;
  }
  constexpr int kManySources = 16;
  const void* src[kManySources];
  int k = 0;
  for (int r = 0; r < p; ++r) {
    if (k == kManySources) {
      ctx.reduce_many(dst, src, k, n);
      src[0] = dst;
      k = 1;
    }
    src[k++] = source(r);
  }
  ctx.reduce_many(dst, src, k, n);
}

// dst[0, n) = reduction over local ranks (in order) of buffer(r, b) at element `at`;
// `own`, when not null, stands for this rank's buffer (its data was not copied in).
void reduce_all(const Context& ctx, const NodeGroup& g, int b, size_t at, size_t n, uint8_t* dst,
                const uint8_t* own = nullptr);

void average(const Context& ctx, void* buf, size_t n, bool on);

// The first phase of a large chunk (n elements of `in`, buffer b): this rank publishes
// all of its chunk but its own slice, waits for every rank, reduces its slice from its
// own input and the others' buffers into its own buffer, and announces that.
void reduce_own_slice(const Context& ctx, NodeGroup& g, int b, const uint8_t* in, size_t n,
                      bool avg);

// Every rank's slice of the chunk (n elements, buffer b), from its owner's buffer to
// its place in `out`.
void copy_slices(const Context& ctx, const NodeGroup& g, int b, size_t n, uint8_t* out,
                 bool stream);

// Elements [mine, mine + mine_n) of the reduction of every local rank's published
// input, in rank order, into `dst` (which stands for element `mine`): peers' pieces
// are read with cross-memory attach into cache-sized scratch, this rank's own are used
// where they are. The caller has published `in` and passed the first phase.
void cma_reduce_slice(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* dst,
                      size_t mine, size_t mine_n, bool avg);

// The two phases of a collective through cross-memory attach: this rank publishes its
// buffers and waits until every rank has, runs `body` (which may read the peers'
// buffers), then arrives and waits until every rank is done reading, so that none
// returns, and lets its buffers change, while another still reads them.
//
// Gather, scatter, alltoall(v) and allgatherv need cross-memory attach (g.cma()): each
// rank reads the blocks it receives straight from their owners' buffers, one copy each,
// and the last phase keeps every rank from returning while others may still read its
// buffers.
template <class Body>
void with_published_buffers(NodeGroup& g, const void* in, void* out, Body&& body) {
  g.publish_buffers(in, out);
  g.arrive();
  g.wait_all();
  body();
  g.arrive();
  g.wait_all();
}

// Reads every peer r's input (counts[r] elements) to displacement displs[r] of `out`
// and moves this rank's own `in` to its place unless it is already there (in place).
void read_blocks(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* out,
                 const std::vector<size_t>& counts, const std::vector<size_t>& displs);

}  // namespace chorus::algorithms::shm
