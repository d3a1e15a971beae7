// Hierarchical collectives for jobs of several nodes with several ranks each (the
// HCCL/NCCL shape): most bytes move inside nodes, where links are fast, and only one
// share per rank crosses the slower network between nodes.
//
// Every phase is a flat algorithm of this folder run among a subset of the ranks, seen
// through a SubsetTransport: the ranks of one node ("intra"), or the ranks that have
// the same local rank on every node ("cross"). The node phases are the functions
// intra_*; they run the direct shared-memory algorithms where the node's ranks share a
// segment (ctx.node), else the ring over the node's ranks. Allreduces of more than
// HierarchicalChoice::chunk_count elements run the three phases chunk by chunk,
// overlapped (allreduce_pipelined below). Which flat algorithms run between nodes, and
// the chunks, are the caller's plan (HierarchicalChoice, algorithms.h).
//
// Requires a uniform topology (every node holds the same number of ranks); on any
// other shape these functions run the flat algorithm instead, so that they are correct
// for every input even though the communicator only picks them for uniform shapes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/ring_pipeline.h"
#include "comm/transport/subset_transport.h"

namespace chorus::algorithms {
namespace {

using transport::SubsetTransport;

// Whether ctx.topology describes ctx's ranks (it may not for a sub-context, which
// carries its parent's topology) in a shape the hierarchical algorithms handle.
bool hierarchical_shape(const Context& ctx) {
  const Topology& t = ctx.topology;
  return t.node_of.size() == static_cast<size_t>(ctx.size) && t.uniform() &&
         t.node_ranks[t.node][t.local_rank] == ctx.rank;
}

// A context for a flat algorithm among the ranks of `view`. It never averages: the
// hierarchical algorithm divides once, by the size of the whole group. It has no
// shared-memory group either: ctx's belongs to the node, not to the view.
Context sub_context(const Context& ctx, transport::Transport& view) {
  return Context{.transport = view, .rank = view.rank(), .size = view.size(),
                 .dtype = ctx.dtype, .elem = ctx.elem, .reduce = ctx.reduce, .average = false,
                 .scratch = ctx.scratch, .segment_bytes = ctx.segment_bytes,
                 .topology = ctx.topology, .op = ctx.op, .tuning = ctx.tuning};
}

// The ranks of this rank's node; ascending, so that view rank == local rank.
const std::vector<int>& node_members(const Context& ctx) {
  return ctx.topology.node_ranks[ctx.topology.node];
}

// The ranks with local rank `local` on every node, ascending (node order need not be
// rank order for local ranks > 0, e.g. nodes {0, 3} and {1, 2}).
std::vector<int> cross_members(const Topology& t, int local) {
  std::vector<int> members;
  for (const std::vector<int>& ranks : t.node_ranks) members.push_back(ranks[local]);
  std::sort(members.begin(), members.end());
  return members;
}

int index_in(const std::vector<int>& members, int rank) {
  return static_cast<int>(std::lower_bound(members.begin(), members.end(), rank) -
                          members.begin());
}

// The nearly equal blocks of `count` over `parts` ranks, as counts and displacements.
struct Blocks {
  std::vector<size_t> counts, displs;
  Blocks(size_t count, int parts) {
    for (int b = 0; b < parts; ++b) {
      counts.push_back(block_count(count, parts, b));
      displs.push_back(block_begin(count, parts, b));
    }
  }
};

// Ring reduce-scatter with the uneven blocks of Blocks(count, sub.size): block b of
// the reduction of `in` lands at its own offset in `out` on rank b. The library's
// reduce_scatter_ring takes equal blocks only; the ring engine takes any.
void reduce_scatter_blocks(const Context& sub, const void* in, void* out, size_t count) {
  const Blocks blocks(count, sub.size);
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* own = dst + blocks.displs[sub.rank] * sub.elem;
  if (sub.size == 1) {
    if (in != out && count > 0) std::memcpy(out, in, count * sub.elem);
    return;
  }
  RingPlan plan;
  for (int b = 0; b < sub.size; ++b) {
    plan.len.push_back(blocks.counts[b] * sub.elem);
    plan.in_off.push_back(blocks.displs[b] * sub.elem);
    plan.out_off.push_back(blocks.displs[b] * sub.elem);
  }
  plan.in = static_cast<const uint8_t*>(in);
  plan.out = dst;
  plan.own_dst = own;
  plan.own_src = own;
  plan.rs_steps = sub.size - 1;
  run_ring(sub, plan);
}

// ---- node phases: shared memory where the node has it. They may use scratch area 0
// only: allgather_hierarchical keeps its packs in area 1 across them.

// The node's ranks reduce `in` (count elements); block `local_rank` of
// Blocks(count, local_size) of the result lands at its offset in `out`. in may be out.
void intra_reduce_scatter(const Context& ctx, const void* in, void* out, size_t count) {
  if (ctx.node != nullptr) {
    const size_t at = block_begin(count, ctx.node->local_size(), ctx.node->local_rank());
    return shm_reduce_scatter_blocks(ctx, *ctx.node, in, static_cast<uint8_t*>(out) + at * ctx.elem,
                                     count, false);
  }
  SubsetTransport node(ctx.transport, node_members(ctx));
  reduce_scatter_blocks(sub_context(ctx, node), in, out, count);
}

// The node's ranks gather the blocks of Blocks(total, local_size): local rank i's `in`
// (block i) lands at block i's offset in `out` on every rank of the node. in may be
// out's own block.
void intra_allgather(const Context& ctx, const void* in, void* out, size_t total) {
  if (ctx.node != nullptr) return shm_allgather_blocks(ctx, *ctx.node, in, out, total);
  SubsetTransport node(ctx.transport, node_members(ctx));
  const Blocks blocks(total, node.size());
  allgatherv_ring(sub_context(ctx, node), in, out, blocks.counts, blocks.displs);
}

// Broadcast among the node's ranks from local rank `root_local`.
void intra_broadcast(const Context& ctx, const HierarchicalChoice& how, void* buf, size_t count,
                     int root_local) {
  if (ctx.node != nullptr) return shm_broadcast(ctx, *ctx.node, buf, buf, count, root_local);
  SubsetTransport node(ctx.transport, node_members(ctx));
  how.broadcast(sub_context(ctx, node), buf, count, root_local);
}

// ---- cross-node phases

// Allreduce of buf (in place) among the ranks with this rank's local rank.
void cross_allreduce(const Context& ctx, const HierarchicalChoice& how, void* buf, size_t count) {
  SubsetTransport cross(ctx.transport, cross_members(ctx.topology, ctx.topology.local_rank));
  how.cross_allreduce(sub_context(ctx, cross), buf, buf, count);
}

// ---- the pipelined allreduce: chunk by chunk, the levels overlapped
//
// Done whole, the node phases run while the link between nodes idles: at 1 Gbit/s, 2
// hosts x 2 ranks, 16 MiB took 157.6 ms where the wire needs 134.2 (docs/performance.md).
// Cut into chunks, chunk c+1 is reduced inside the node and chunk c-L distributed there
// while chunks c-L+1..c cross between nodes.
//
// Chunk c's exchange between nodes is a ring allreduce of this rank's block of the chunk
// among the ranks with its local rank (the cross group of n ranks): 2(n-1) steps of one
// sub-block each. Step j of chunk c is posted in pipeline iteration c + j and its
// receive waited for in the next one, so that every iteration sends one sub-block of
// each of L = 2(n-1) chunks in flight, in a fixed order (stage j = 0..L-1, chunk c - j):
// the order in which the receiver posts its receives, whatever the timing. The sums
// are therefore the same bytes on every run: chunk boundaries, blocks and the ring's
// order depend on count, element size, layout, hier_chunk_bytes and hier_max_chunks
// only.
//
// Progress over tcp happens only while a rank waits in the transport, not while it
// waits in a node phase. Before the node phases of iteration t a rank waits until
// its sends of iterations before t have left (reached the kernel): the receiver waits
// for exactly those in its iteration t before its own node phases, so it reads them,
// and a rank stuck in a node phase never holds bytes another rank waits for. Sends of
// iteration t itself may still be queued then; the kernel's socket buffers carry them
// over the link during the node phases, which is the overlap.

// One chunk of the pipeline: its element range, and this rank's block of it.
struct Chunk {
  size_t begin = 0, count = 0;  // elements of the whole buffer
  size_t block_begin = 0, block_count = 0;  // this rank's block, elements of the buffer
};

class CrossPipeline {
 public:
  CrossPipeline(const Context& ctx, void* out, uint8_t* incoming, size_t max_block)
      : ctx_(ctx), out_(static_cast<uint8_t*>(out)), incoming_(incoming), max_block_(max_block),
        cross_(ctx.transport, cross_members(ctx.topology, ctx.topology.local_rank)),
        n_(cross_.size()), r_(cross_.rank()), recvs_(stages() + 1) {}

  int stages() const { return 2 * (n_ - 1); }

  // Stage j (0..stages()) of chunk c: j > 0 waits for step j-1's receive (posted in
  // the previous iteration) and reduces it; j < stages() posts step j.
  void stage(const Chunk& chunk, size_t c, int j) {
    uint8_t* block = out_ + chunk.block_begin * ctx_.elem;
    // Reduce-scatter receives land in the chunk's own area, at their sub-block's offset;
    // the area is reused by chunk c + n, whose first receive comes after chunk c's last.
    uint8_t* incoming = incoming_ + (c % static_cast<size_t>(n_)) * max_block_;
    transport::Request& recv = recvs_[c % recvs_.size()];
    const int rs = n_ - 1;
    if (j > 0) {
      cross_.wait(recv);
      const int s = j - 1;
      if (s < rs) {
        auto [off, len] = sub_block(chunk, mod(r_ - s - 2, n_));
        ctx_.reduce(block + off, block + off, incoming + off, len / ctx_.elem);
      }
    }
    if (j == stages()) return;
    // Reduce-scatter step j sends sub-block r-j-1 (reduced in step j-1, or the node's
    // sum for j = 0) and receives r-j-2; allgather step a sends r-a (own, complete
    // after the reduce-scatter) and receives r-a-1 into place.
    const bool reducing = j < rs;
    const int a = j - rs;
    auto [soff, slen] = sub_block(chunk, reducing ? mod(r_ - j - 1, n_) : mod(r_ - a, n_));
    auto [roff, rlen] = sub_block(chunk, reducing ? mod(r_ - j - 2, n_) : mod(r_ - a - 1, n_));
    last_send_ = cross_.isend(mod(r_ + 1, n_), block + soff, slen);
    sent_ = true;
    recv = cross_.irecv(mod(r_ - 1, n_), (reducing ? incoming : block) + roff, rlen);
  }

  // Waits until every send posted before the previous call has left (see above).
  void flush_previous() {
    if (has_previous_) cross_.wait(previous_);
    has_previous_ = sent_;
    previous_ = last_send_;
    sent_ = false;
  }

  void finish() { cross_.wait_all(); }

 private:
  // Byte offset and length of sub-block k of the chunk's block.
  std::pair<size_t, size_t> sub_block(const Chunk& chunk, int k) const {
    return {block_begin(chunk.block_count, n_, k) * ctx_.elem,
            block_count(chunk.block_count, n_, k) * ctx_.elem};
  }

  const Context& ctx_;
  uint8_t* out_;
  uint8_t* incoming_;
  size_t max_block_;  // bytes of the largest block: the stride of the receive areas
  SubsetTransport cross_;
  int n_, r_;
  std::vector<transport::Request> recvs_;  // per chunk in flight (c % size): its pending receive
  transport::Request last_send_, previous_;
  bool sent_ = false, has_previous_ = false;
};

void allreduce_pipelined(const Context& ctx, const void* in, void* out, size_t count,
                         size_t chunk_count) {
  const Topology& t = ctx.topology;
  const size_t chunks = (count + chunk_count - 1) / chunk_count;
  auto chunk_at = [&](size_t c) {
    Chunk k;
    k.begin = c * chunk_count;
    k.count = std::min(chunk_count, count - k.begin);
    k.block_begin = k.begin + block_begin(k.count, t.local_size, t.local_rank);
    k.block_count = block_count(k.count, t.local_size, t.local_rank);
    return k;
  };
  auto at = [&](const void* base, size_t index) {
    return static_cast<const uint8_t*>(base) + index * ctx.elem;
  };
  auto* dst = static_cast<uint8_t*>(out);
  // Node phases: scratch area 0 at most; the receive areas are in area 1.
  auto reduce_in_node = [&](size_t c) {
    Chunk k = chunk_at(c);
    intra_reduce_scatter(ctx, at(in, k.begin), dst + k.begin * ctx.elem, k.count);
  };
  auto gather_in_node = [&](size_t c) {
    Chunk k = chunk_at(c);
    uint8_t* block = dst + k.block_begin * ctx.elem;
    finish_average(ctx, block, k.block_count);
    intra_allgather(ctx, block, dst + k.begin * ctx.elem, k.count);
  };

  const size_t max_block = block_count(chunk_count, t.local_size, 0) * ctx.elem;
  uint8_t* incoming = ctx.scratch.get(max_block * t.nodes, 1);
  CrossPipeline cross(ctx, out, incoming, max_block);
  const int stages = cross.stages();
  reduce_in_node(0);
  for (size_t it = 0; it < chunks + stages; ++it) {
    for (int j = 0; j <= stages && static_cast<size_t>(j) <= it; ++j) {
      const size_t c = it - j;
      if (c < chunks) cross.stage(chunk_at(c), c, j);
    }
    cross.flush_previous();
    if (it >= static_cast<size_t>(stages)) gather_in_node(it - stages);
    if (it + 1 < chunks) reduce_in_node(it + 1);
  }
  cross.finish();
}

void flat_allgather(const Context& ctx, const void* in, void* out, size_t count) {
  std::vector<size_t> counts(ctx.size, count), displs(ctx.size);
  for (int r = 0; r < ctx.size; ++r) displs[r] = static_cast<size_t>(r) * count;
  allgatherv_ring(ctx, in, out, counts, displs);
}

}  // namespace

void allreduce_hierarchical(const Context& ctx, const HierarchicalChoice& how, const void* in, void* out,
                            size_t count) {
  if (!hierarchical_shape(ctx)) return allreduce_ring(ctx, in, out, count);
  const Topology& t = ctx.topology;
  // The pipeline needs work inside nodes and a link between them (the plan asks for it
  // only there).
  if (how.chunk_count > 0 && count > how.chunk_count && t.nodes > 1 && t.local_size > 1) {
    return allreduce_pipelined(ctx, in, out, count, how.chunk_count);
  }
  const Blocks blocks(count, t.local_size);
  const size_t mine = blocks.counts[t.local_rank];
  uint8_t* block = static_cast<uint8_t*>(out) + blocks.displs[t.local_rank] * ctx.elem;
  intra_reduce_scatter(ctx, in, out, count);
  // Every member of a cross group has the same block size, so all skip together.
  if (mine > 0) cross_allreduce(ctx, how, block, mine);
  // Once, over the whole group, on the one block this rank owns; the allgather then
  // copies the same bytes to every rank of the node.
  finish_average(ctx, block, mine);
  intra_allgather(ctx, block, out, count);
}

void broadcast_hierarchical(const Context& ctx, const HierarchicalChoice& how, void* buf, size_t count,
                            int root) {
  if (!hierarchical_shape(ctx)) return how.broadcast(ctx, buf, count, root);
  const Topology& t = ctx.topology;
  const std::vector<int>& root_node = t.node_ranks[t.node_of[root]];
  const int root_local = index_in(root_node, root);
  // First the ranks with root's local rank (one per node) get the data, then each of
  // them serves its own node.
  if (t.local_rank == root_local) {
    std::vector<int> members = cross_members(t, root_local);
    SubsetTransport cross(ctx.transport, members);
    how.broadcast(sub_context(ctx, cross), buf, count, index_in(members, root));
  }
  intra_broadcast(ctx, how, buf, count, root_local);
}

// Layout: the node phase fills this node's "pack" (its ranks' blocks in local-rank
// order), the cross phase exchanges packs, placed in the order of the cross group's
// members. When that order is the rank order (nodes made of consecutive ranks) the
// packs are gathered straight into `out`; otherwise they go to scratch area 1 (the
// phases use area 0 at most) and are then copied to their ranks' places.
void allgather_hierarchical(const Context& ctx, const void* in, void* out, size_t count) {
  if (!hierarchical_shape(ctx)) return flat_allgather(ctx, in, out, count);
  const Topology& t = ctx.topology;
  const int local = t.local_size, nodes = t.nodes;
  const std::vector<int> members = cross_members(t, t.local_rank);
  // rank_at[p]: the rank whose block is at position p of the gathered packs.
  std::vector<int> rank_at;
  for (int member : members) {
    for (int rank : t.node_ranks[t.node_of[member]]) rank_at.push_back(rank);
  }
  bool direct = true;
  for (int p = 0; p < ctx.size; ++p) direct = direct && rank_at[p] == p;

  const size_t block_bytes = count * ctx.elem, pack_count = count * local;
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* gathered = direct ? dst : ctx.scratch.get(block_bytes * ctx.size, 1);
  const int me = index_in(members, ctx.rank);
  uint8_t* pack = gathered + me * pack_count * ctx.elem;

  intra_allgather(ctx, in, pack, pack_count);  // equal blocks of `count`

  SubsetTransport cross(ctx.transport, members);
  std::vector<size_t> pack_counts(nodes, pack_count), pack_displs(nodes);
  for (int s = 0; s < nodes; ++s) pack_displs[s] = static_cast<size_t>(s) * pack_count;
  allgatherv_ring(sub_context(ctx, cross), pack, gathered, pack_counts, pack_displs);

  if (direct || block_bytes == 0) return;
  for (int p = 0; p < ctx.size; ++p) {
    std::memcpy(dst + rank_at[p] * block_bytes, gathered + p * block_bytes, block_bytes);
  }
}

}  // namespace chorus::algorithms
