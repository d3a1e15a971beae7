// Every collective algorithm of chorus_comm. Each is implemented in its own file and
// runs on the communicator's progress thread; buffers are already validated.
// Byte counts never overflow (the communicator checks count * element size).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "comm/algorithms/context.h"
#include "comm/shared/memory_file.h"

namespace chorus::algorithms {

// ---- allreduce: out = reduce over ranks of in (count elements); in may equal out.
void allreduce_ring(const Context& ctx, const void* in, void* out, size_t count);
void allreduce_recursive_doubling(const Context& ctx, const void* in, void* out, size_t count);
void allreduce_halving_doubling(const Context& ctx, const void* in, void* out, size_t count);

// ---- reduce_scatter: out (count elements) = reduction of block `rank` of in (size *
// count elements). out may alias in's block `rank`. The ring (size - 1 steps, its
// reductions pipelined), or recursive halving (log2 size steps, two more where size is
// not a power of two; scratch areas 0 and 1: size * count elements each).
void reduce_scatter_ring(const Context& ctx, const void* in, void* out, size_t count);
void reduce_scatter_halving(const Context& ctx, const void* in, void* out, size_t count);

// ---- allgather(v) (ring): out's block r (counts[r] elements at displs[r]) = in of
// rank r. `in` may be out's own block.
void allgatherv_ring(const Context& ctx, const void* in, void* out,
                     std::span<const size_t> counts, std::span<const size_t> displs);
// ---- allgather (Bruck): out's block r (count elements) = in of rank r, in
// ceil(log2 size) rounds of doubling runs of blocks (scratch area 0: size * count
// elements) and a rotation. `in` may be out's own block.
void allgather_bruck(const Context& ctx, const void* in, void* out, size_t count);

// ---- broadcast: buf on every rank = buf of root.
void broadcast_binomial(const Context& ctx, void* buf, size_t count, int root);
void broadcast_chain(const Context& ctx, void* buf, size_t count, int root);

// ---- reduce: out on root = reduction of in. out is used only on root.
void reduce_binomial(const Context& ctx, const void* in, void* out, size_t count, int root);
void reduce_ring(const Context& ctx, const void* in, void* out, size_t count, int root);

// ---- gather / scatter: direct (the root talks to every rank), or a binomial tree
// (ceil(log2 size) rounds; scratch area 0: a subtree's blocks, all of them at a root
// other than rank 0). Gather: out (size * count, used on the root only) = every rank's
// in, in may be out's block `root`; scatter: out = block `rank` of the root's in, out
// may be in's block `root` on the root.
void gather_direct(const Context& ctx, const void* in, void* out, size_t count, int root);
void scatter_direct(const Context& ctx, const void* in, void* out, size_t count, int root);
void gather_binomial(const Context& ctx, const void* in, void* out, size_t count, int root);
void scatter_binomial(const Context& ctx, const void* in, void* out, size_t count, int root);
// The ranks in the subtree of rank v (renumbered from the root, 0) of the binomial
// tree over `size` ranks: v and the ranks above it up to its lowest set bit.
inline int binomial_subtree(int v, int size) { return v == 0 ? size : std::min(v & -v, size - v); }

// ---- alltoallv (pairwise exchange); counts and displacements in elements.
void alltoallv_pairwise(const Context& ctx, const void* in, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* out,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs);

// ---- alltoall (Bruck): out's block q (count elements) = block `rank` of rank q's in,
// in ceil(log2 size) rounds (scratch area 0: size * count elements; areas 1 and 2:
// about half of that each). `in` may be `out`.
void alltoall_bruck(const Context& ctx, const void* in, void* out, size_t count);

// ---- barrier (dissemination).
void barrier_dissemination(const Context& ctx);

// Applies the average on `count` elements when ctx.average is set.
void finish_average(const Context& ctx, void* buf, size_t count);

// ---- direct shared memory (shm/, one file each): the ranks of `g` (one node) through
// its segment; ranks are g's local ranks. `avg` divides by ctx.size (the whole
// communicator's), so that a hierarchical algorithm can leave it to its last step.
// Blocks of the *_blocks variants are block_begin/block_count(total, local size, r).
// A small allreduce run at issue (the communicator's inline path, communicator/plan.cc):
// shm_allreduce_small() says whether `bytes` is one chunk reduced whole on this node;
// _start() copies in, arrives, and finishes when every rank has arrived within `polls`
// polls (true); otherwise it returns false with the buffer it used in `b`, and _finish()
// completes the operation later, as shm_allreduce() would have.
bool shm_allreduce_small(const Tuning& t, const transport::shm::NodeGroup& g, size_t bytes);
bool shm_allreduce_small_start(const Context& ctx, transport::shm::NodeGroup& g, const void* in,
                               void* out, size_t count, bool avg, int polls, int& b);
void shm_allreduce_small_finish(const Context& ctx, transport::shm::NodeGroup& g, int b, void* out,
                                size_t count, bool avg);
void shm_allreduce(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                   size_t count, bool avg);
void shm_reduce(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                size_t count, int root);
// `send` is the root's data (the other ranks ignore it); it may be `buf`.
void shm_broadcast(const Context& ctx, transport::shm::NodeGroup& g, const void* send, void* buf,
                   size_t count, int root);
void shm_allgather_blocks(const Context& ctx, transport::shm::NodeGroup& g, const void* in,
                          void* out, size_t total);
void shm_reduce_scatter_blocks(const Context& ctx, transport::shm::NodeGroup& g, const void* in,
                               void* out, size_t total, bool avg);
// These five need g.cma() (the ranks read each other's buffers).
void shm_allgatherv(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                    const std::vector<size_t>& counts, const std::vector<size_t>& displs);
void shm_gather(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                size_t count, int root);
void shm_scatter(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                 size_t count, int root);
void shm_alltoall(const Context& ctx, transport::shm::NodeGroup& g, const void* in, void* out,
                  size_t count);
// alltoallv: every rank first reads what each peer will send it (announced[r], in
// elements) and `verdict(announced)` says whether that disagrees with what it expects
// (this rank's number; INT32_MAX: no). The ranks agree on the lowest verdict; when any
// rank disagrees, no data moves and every rank returns that verdict; otherwise the data
// moves and every rank returns INT32_MAX. `in` may be `out`.
using CountsVerdict = std::function<int32_t(const std::vector<uint64_t>& announced)>;
int32_t shm_alltoallv(const Context& ctx, transport::shm::NodeGroup& g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs, const CountsVerdict& verdict);
void shm_barrier(const Context& ctx, transport::shm::NodeGroup& g);

// ---- alltoallv with its counts checked (alltoallv_agreed.cc): every rank learns what
// each peer sends it and checks it against recv_counts, and the ranks agree on the
// verdict, so that a mismatch throws InvalidArgumentError on every rank, naming the
// first disagreement the lowest finder saw. Through `g` (shm_alltoallv, which needs
// g->cma()) when it is not null: the counts are read before any data moves. Over the
// transport otherwise, in two latencies: each count travels just ahead of its data, and
// the findings behind it; where the counts disagree, the receive buffer's blocks are
// unspecified (the streams and the communicator stay usable). `in` may be `out`.
void alltoallv_agreed(const Context& ctx, transport::shm::NodeGroup* g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs);

// ---- the direct path (shm/shared_buffers.cc): every local rank passed node-shared
// buffers (include/chorus/shared_memory.h), `in` and `out` say where this rank's lie.
// The communicator is one node (g's ranks are its ranks). Broadcast ignores `in` on
// ranks other than the root; in place is `in` == `out` (reduce_scatter: out == in's
// block of this rank; allgather: in == out's block of this rank).
void shared_allreduce(const Context& ctx, transport::shm::NodeGroup& g,
                      const shared::SharedRef& in, const shared::SharedRef& out,
                      size_t count, bool avg);
// The same run at issue (the communicator's inline path): _start() enters the call and,
// when every rank has entered within `polls` polls, finishes it (true); otherwise it
// returns false and _finish() completes the call later, as shared_allreduce() would.
bool shared_allreduce_start(const Context& ctx, transport::shm::NodeGroup& g,
                            const shared::SharedRef& in, const shared::SharedRef& out,
                            size_t count, bool avg, int polls);
void shared_allreduce_finish(const Context& ctx, transport::shm::NodeGroup& g, size_t count, bool avg);
// The communicator runs it whole at issue up to Tuning::shared_allreduce_at_issue_bytes.
// Whether a larger one is entered at issue: where the node has no core to spare, its
// ranks enter it when they issue it (_arrive(), then _finish() later from the queue), and
// its pieces are shared work, so that the first rank to wait does every piece while its
// peers still compute (DDP's first bucket, reduced by the rank whose backward pass ended
// first). Every rank of the node decides alike.
bool shared_allreduce_arrives_at_issue(const Tuning& t, const transport::shm::NodeGroup& g, size_t bytes);
void shared_allreduce_arrive(transport::shm::NodeGroup& g, const shared::SharedRef& in,
                             const shared::SharedRef& out, size_t count);
void shared_reduce_scatter(const Context& ctx, transport::shm::NodeGroup& g,
                           const shared::SharedRef& in, const shared::SharedRef& out,
                           size_t recv_count, bool avg);
void shared_allgather(const Context& ctx, transport::shm::NodeGroup& g,
                      const shared::SharedRef& in, const shared::SharedRef& out,
                      size_t count);
void shared_broadcast(const Context& ctx, transport::shm::NodeGroup& g,
                      const shared::SharedRef& in, const shared::SharedRef& out,
                      size_t count, int root);

// ---- hierarchical (nodes of ctx.topology; hierarchical.cc): the contracts of the flat
// allreduce, broadcast and allgather (allgather: out's block r of count elements = in
// of rank r; in may be out's own block). They need a uniform topology that describes
// ctx's ranks, and run a flat algorithm otherwise.
//
// What runs inside a hierarchical call is decided by the caller's plan
// (communicator/plan.cc: hierarchical_choice(), from the Tuning cut-offs); these
// functions run the choice and decide nothing. The ranks of a call must be given the
// same choice, except cross_allreduce, which must agree among the ranks of one local
// rank (they reduce blocks of one size).
struct HierarchicalChoice {
  // The allreduce between nodes of an unpipelined allreduce, on this rank's block, among
  // the ranks with its local rank: allreduce_recursive_doubling, _halving_doubling or
  // _ring.
  void (*cross_allreduce)(const Context&, const void*, void*, size_t) = allreduce_ring;
  // Broadcast between nodes and, without shared memory, inside one (and the flat
  // broadcast off a hierarchical shape): broadcast_binomial or broadcast_chain.
  void (*broadcast)(const Context&, void*, size_t, int) = broadcast_chain;
  // Elements per chunk of the pipelined allreduce (the node phases overlapped with the
  // exchange between nodes); 0: the three phases one after the other, whole.
  size_t chunk_count = 0;
};
void allreduce_hierarchical(const Context& ctx, const HierarchicalChoice& how, const void* in, void* out,
                            size_t count);
void broadcast_hierarchical(const Context& ctx, const HierarchicalChoice& how, void* buf, size_t count,
                            int root);
void allgather_hierarchical(const Context& ctx, const void* in, void* out, size_t count);

}  // namespace chorus::algorithms
