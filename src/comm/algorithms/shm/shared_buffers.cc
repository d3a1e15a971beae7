// The direct path: collectives whose ranks all pass node-shared buffers
// (include/chorus/shared_memory.h), which every local rank can read and write.
//
// Each runs in two steps. A phase (its descriptor says "on node-shared buffers")
// guarantees that every rank has entered the call, so its buffers hold its input, and
// publishes where they are. Then the ranks cut the data in pieces, and whichever rank
// gets a piece does all of it, for every rank: sums it over every rank's input, in rank
// order, and writes the sum into every rank's output (allreduce), or into its owner's
// (reduce_scatter), or copies it from its owner into every rank's output (allgather,
// broadcast). Every element is therefore computed once, so all ranks get the same
// bytes. With a core to spare each rank does a contiguous share of the pieces and a
// second phase ends the call; with more ranks than cores, and for a large allreduce
// with as many, the pieces are NodeGroup's shared work, so that the ranks that hold the
// cores do the work of those waiting for one or still computing (run_pieces). Either
// way a rank returns only once every piece is done: by then nobody reads or writes its
// buffers any more.
//
// Nothing is copied into the segment: an allreduce reads each rank's input once and
// writes each rank's output once (the sum is copied from the cache into the others'
// outputs), about 2.5 passes over the data per rank for two ranks, against about 5
// through the segment.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::kSharedStep;
using transport::shm::NodeGroup;
using shared::SharedRef;

namespace {

struct Buffers {
  std::vector<const uint8_t*> in;
  std::vector<uint8_t*> out;
};

// This rank's arrival at the phase that enters collective `c`, publishing its buffers.
void announce(NodeGroup& g, Collective c, const SharedRef& in, const SharedRef& out) {
  g.expect(static_cast<uint8_t>(wire_code(c) | kSharedStep));
  g.publish_shared(in, out);
  g.arrive();
}

// The phase: publishes this rank's buffers and waits for every rank.
void enter(NodeGroup& g, Collective c, const SharedRef& in, const SharedRef& out) {
  announce(g, c, in, out);
  g.wait_all();
}

// Every rank's buffers, in this process (`in` only where `with_in`), looked up when
// this rank starts its first piece: while it works on one, the call is not over on any
// rank, so none has returned and published the buffers of its next call (a rank that
// gets no piece may find its peers already there, and must not look).
class Peers {
 public:
  Peers(NodeGroup& g, std::vector<bool> with_in) : g_(g), with_in_(std::move(with_in)) {}
  const Buffers& get() {
    if (b_.out.empty()) {
      const int p = g_.local_size();
      b_.in.assign(p, nullptr);
      b_.out.assign(p, nullptr);
      for (int r = 0; r < p; ++r) {
        if (with_in_[r]) b_.in[r] = g_.peer_shared(r, 0);
        b_.out[r] = g_.peer_shared(r, 1);
      }
    }
    return b_;
  }

 private:
  NodeGroup& g_;
  std::vector<bool> with_in_;
  Buffers b_;
};

// dst[0, n) = the reduction of src[r] + off over r (at least two: the direct path is
// never taken by one rank, CommunicatorImpl::direct_path_possible()), in rank order. Where dst is the
// piece of a source r > 0 (an in-place reduce_scatter's block of a later rank), that
// piece is first copied to `tmp` (n elements): the partial sums would overwrite it
// before it is added. dst may be source 0's piece (in place, rank 0's block).
void reduce_sources(const Context& ctx, uint8_t* dst, const std::vector<const uint8_t*>& src,
                    size_t off, size_t n, uint8_t* tmp) {
  const int p = static_cast<int>(src.size());
  int alias = -1;
  for (int r = 1; r < p && alias < 0; ++r) {
    if (src[r] + off == dst) alias = r;
  }
  if (alias > 0) std::memcpy(tmp, dst, n * ctx.elem);
  shm::reduce_ranks(ctx, p, n, dst, [&](int r) -> const uint8_t* { return r == alias ? tmp : src[r] + off; });
}

// Elements of a piece for a call of `bytes` in all: Tuning::shared_buffer_piece_bytes,
// but small calls are cut into at least two pieces per rank (of at least
// kMinPieceBytes), so that every rank has a share.
size_t piece_elems(const Context& ctx, const NodeGroup& g, size_t bytes) {
  constexpr size_t kMinPieceBytes = 8 * 1024;
  const size_t share = bytes / (2 * static_cast<size_t>(g.local_size()));
  const size_t piece = std::min(ctx.tuning.shared_buffer_piece_bytes, std::max(share, kMinPieceBytes));
  return std::max<size_t>(1, piece / ctx.elem);
}

// Runs body(k) for every piece k of [0, pieces) once, on some rank, and returns once all
// are done on every rank. Unless `shared`, each rank does a contiguous share of the
// pieces and a phase ends the call: no counter that every piece bounces between the
// cores. When `shared`, the pieces are shared work (NodeGroup): whichever rank runs
// takes the next one, so that the ranks that hold the cores do the share of those that
// wait for one, or are still computing. Every rank must pass the same `shared`.
template <class Body>
void run_pieces(NodeGroup& g, uint64_t pieces, bool shared, Body&& body) {
  if (!shared) {
    const int p = g.local_size(), me = g.local_rank();
    const uint64_t first = block_begin(pieces, p, me), mine = block_count(pieces, p, me);
    for (uint64_t k = first; k < first + mine; ++k) body(k);
    g.arrive();
    g.wait_all();
    return;
  }
  g.begin_work(pieces);
  for (int64_t k; (k = g.take_piece()) >= 0;) {
    body(static_cast<uint64_t>(k));
    g.finish_piece();
  }
  g.wait_work();
}

// The allreduce once every rank has entered it. Its pieces are shared work with more
// ranks than cores, and also where the call is entered at issue
// (shared_allreduce_arrives_at_issue(): no core to spare), so that the first rank to
// wait, whose peers may still be computing, does every piece it finds left.
void shared_allreduce_pieces(const Context& ctx, NodeGroup& g, size_t count, bool avg) {
  const int p = g.local_size();
  const size_t e = ctx.elem, piece = piece_elems(ctx, g, count * e);
  const bool shared = g.oversubscribed() || shared_allreduce_arrives_at_issue(ctx.tuning, g, count * e);
  Peers peers(g, std::vector<bool>(p, true));
  uint8_t* tmp = p > 2 ? ctx.scratch.get(piece * e, 0) : nullptr;
  run_pieces(g, (count + piece - 1) / piece, shared, [&](uint64_t k) {
    const Buffers& b = peers.get();
    const size_t at = k * piece, n = std::min(piece, count - at);
    uint8_t* sum = b.out[0] + at * e;
    reduce_sources(ctx, sum, b.in, at * e, n, tmp);
    shm::average(ctx, sum, n, avg);
    for (int r = 1; r < p; ++r) std::memcpy(b.out[r] + at * e, sum, n * e);
  });
}

}  // namespace

void shared_allreduce(const Context& ctx, NodeGroup& g, const SharedRef& in, const SharedRef& out,
                      size_t count, bool avg) {
  if (count == 0) return;
  enter(g, Collective::kAllreduce, in, out);
  shared_allreduce_pieces(ctx, g, count, avg);
}

bool shared_allreduce_start(const Context& ctx, NodeGroup& g, const SharedRef& in, const SharedRef& out,
                            size_t count, bool avg, int polls) {
  if (count == 0) return true;
  announce(g, Collective::kAllreduce, in, out);
  if (!g.poll_all(polls)) return false;
  shared_allreduce_pieces(ctx, g, count, avg);
  return true;
}

bool shared_allreduce_arrives_at_issue(const Tuning& t, const NodeGroup& g, size_t bytes) {
  return g.no_spare_core() && bytes > t.shared_allreduce_at_issue_bytes;
}

void shared_allreduce_arrive(NodeGroup& g, const SharedRef& in, const SharedRef& out, size_t count) {
  if (count != 0) announce(g, Collective::kAllreduce, in, out);
}

void shared_allreduce_finish(const Context& ctx, NodeGroup& g, size_t count, bool avg) {
  if (count == 0) return;
  g.wait_all();
  shared_allreduce_pieces(ctx, g, count, avg);
}

void shared_reduce_scatter(const Context& ctx, NodeGroup& g, const SharedRef& in,
                           const SharedRef& out, size_t recv_count, bool avg) {
  if (recv_count == 0) return;
  const int p = g.local_size();
  const size_t e = ctx.elem, piece = piece_elems(ctx, g, recv_count * p * e);
  enter(g, Collective::kReduceScatter, in, out);
  Peers peers(g, std::vector<bool>(p, true));
  uint8_t* tmp = ctx.scratch.get(piece * e, 0);
  const size_t per_block = (recv_count + piece - 1) / piece;
  run_pieces(g, per_block * static_cast<size_t>(p), g.oversubscribed(), [&](uint64_t k) {
    const Buffers& b = peers.get();
    const int owner = static_cast<int>(k / per_block);
    const size_t at = k % per_block * piece, n = std::min(piece, recv_count - at);
    uint8_t* dst = b.out[owner] + at * e;
    const size_t off = (static_cast<size_t>(owner) * recv_count + at) * e;
    reduce_sources(ctx, dst, b.in, off, n, tmp);
    shm::average(ctx, dst, n, avg);
  });
}

void shared_allgather(const Context& ctx, NodeGroup& g, const SharedRef& in, const SharedRef& out,
                      size_t count) {
  if (count == 0) return;
  const int p = g.local_size();
  const size_t e = ctx.elem, piece = piece_elems(ctx, g, count * p * e);
  enter(g, Collective::kAllgather, in, out);
  Peers peers(g, std::vector<bool>(p, true));
  const size_t per_block = (count + piece - 1) / piece;
  run_pieces(g, per_block * static_cast<size_t>(p), g.oversubscribed(), [&](uint64_t k) {
    const Buffers& b = peers.get();
    const int owner = static_cast<int>(k / per_block);
    const size_t at = k % per_block * piece, n = std::min(piece, count - at);
    const uint8_t* from = b.in[owner] + at * e;
    const size_t to = (static_cast<size_t>(owner) * count + at) * e;
    for (int r = 0; r < p; ++r) {
      if (b.out[r] + to != from) std::memcpy(b.out[r] + to, from, n * e);
    }
  });
}

void shared_broadcast(const Context& ctx, NodeGroup& g, const SharedRef& in, const SharedRef& out,
                      size_t count, int root) {
  if (count == 0) return;
  const int p = g.local_size();
  const size_t e = ctx.elem, piece = piece_elems(ctx, g, count * e);
  std::vector<bool> with_in(p, false);
  with_in[root] = true;
  enter(g, Collective::kBroadcast, g.local_rank() == root ? in : SharedRef{}, out);
  Peers peers(g, std::move(with_in));
  run_pieces(g, (count + piece - 1) / piece, g.oversubscribed(), [&](uint64_t k) {
    const Buffers& b = peers.get();
    const size_t at = k * piece, n = std::min(piece, count - at);
    const uint8_t* from = b.in[root] + at * e;
    for (int r = 0; r < p; ++r) {
      if (b.out[r] + at * e != from) std::memcpy(b.out[r] + at * e, from, n * e);
    }
  });
}

}  // namespace chorus::algorithms
