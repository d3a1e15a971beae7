// Every measured threshold of the algorithms, in one table: the sizes at which an
// algorithm changes its path, its chunks and its pieces. The defaults are what was
// measured (each with its measurement); the cost model owns the table
// (communicator/cost_model.h: CostParams::tuning, which CHORUS_COST_MODEL may change
// key by key, the keys being the field names), selection reads its cut-offs from it,
// and every algorithm reads it through Context::tuning.
//
// The direct shared-memory thresholds (algorithms/shm/) were measured on a 2-core
// machine, the hierarchical and tree ones over loopback with chorus-bench.
#pragma once

#include <cstddef>

namespace chorus::algorithms {

struct Tuning {
  // ---- direct shared memory, allreduce (algorithms/shm/allreduce.cc)

  // Allreduce chunks of up to this many bytes, in groups of more than two, are reduced
  // whole by every rank instead of shared out: no wait for the pieces, no copy out of the
  // result. With more ranks than cores (whole_oversubscribed_bytes) the ranks that wait
  // for a core cost a switch each anyway. Measured with 4 ranks on 2 cores (bound to
  // them), whole against shared: 8 KiB 9.3 against 11.7-12.0 us, 16 KiB 11.3 against
  // 12.8-13.4 us, 32 KiB 14.9 against 16.3-16.7 us, 64 KiB 23.0 against 19.9-20.8 us
  // (slower).
  size_t whole_bytes = 8 * 1024;
  size_t whole_oversubscribed_bytes = 32 * 1024;
  // With more than two ranks per core (NodeGroup::crowded()) the shared reduction was
  // slower than slices, from 64 KiB to 256 KiB in one chunk (8 ranks on 2 cores: 64 KiB
  // 124 -> 151 us, 128 KiB 145 -> 290 us, 256 KiB 211 -> 457 us; 6 ranks: 256 KiB 148 ->
  // 259 us), and faster only from 512 KiB (8 ranks: 1 MiB 621 -> 575 us). Such groups
  // keep the sliced path, in buffer-sized chunks, with chunks of up to 64 KiB reduced
  // whole (8 ranks, 64 KiB: 124 us whole).
  size_t whole_crowded_bytes = 64 * 1024;
  // Chunks of a shared reduction: the 4 ranks' copies of a 256 KiB chunk (1 MiB) stay in
  // the caches of 2 cores until the pieces are reduced; of a 1 MiB chunk they did not
  // (4 ranks on 2 cores: 1 MiB 267 us in 256 KiB chunks, 433 us in 1 MiB chunks; 4 MiB
  // 1107 against 1736 us). At least kMinChunkBytes.
  size_t shared_chunk_bytes = 256 * 1024;
  // Two ranks reduce chunks of up to pair_whole_bytes whole (one phase), larger ones in
  // slices (allreduce.cc): two phases, but each rank copies in only the half its peer
  // reduces, reduces its own half where its input is and copies only the peer's half
  // out, about four passes of half the chunk against five of the whole one. Whole
  // against slices, 2 ranks on this 2-core machine, in place / out of place (best of 3
  // runs): 4 KiB 1.35 / 0.95 against 1.31 / 1.34 us, 8 KiB 2.34 / 1.58 against 2.23 /
  // 1.52 us, 16 KiB 4.11 / 2.42 against 3.76 / 2.26 us, 128 KiB 27.0 / 14.1 against 24.7
  // / 12.9 us; whole chunks of 512 KiB against slices, in place: 1 MiB 162 -> 62 us,
  // 4 MiB 598 -> 298 us, 16 MiB 2.58 -> 1.83 ms, 256 MiB 42.1 -> 28.3 ms; out of place:
  // 1 MiB 144 -> 77 us, 4 MiB 621 -> 342 us, 256 MiB 53.8 -> 47.0 ms.
  size_t pair_whole_bytes = 8 * 1024;
  // The chunks of two ranks (at least kMinChunkBytes). Slices in chunks of 256 KiB, 512
  // KiB and 1 MiB, in place: 1 MiB 98.7, 73.2, 70.6 us; 4 MiB 402, 295, 294 us; 16 MiB
  // 1.89, 1.76, 1.96 ms; 256 MiB 31.3, 25.3, 30.1 ms; out of place: 1 MiB 94.6, 77.5,
  // 65.8 us; 4 MiB 406, 317, 407 us.
  size_t pair_chunk_bytes = 512 * 1024;
  // Results of at least this many bytes are written around the caches (streaming
  // stores): they would not fit anyway, and a normal store first reads every line it
  // writes, a third more memory traffic.
  size_t stream_bytes = 64 * 1024 * 1024;
  // A piece of a shared reduction: small enough that the ranks that run share a chunk
  // out evenly, large enough that taking it costs little against reducing it (16 KiB
  // pieces measured the same as 32 KiB ones, within noise, from 64 KiB to 4 MiB).
  size_t shared_piece_bytes = 32 * 1024;
  // Reductions of up to this many bytes read all sources in one pass (ReduceManyFn);
  // larger ones one source after another, which was faster from 256 KiB up (4 sources,
  // f32, two of them written by the other core: 64 KiB 6.8 -> 5.4-5.5 us in one pass,
  // 256 KiB 22.6 against 24.4 us, 1 MiB 109 against 115 us).
  size_t many_max_bytes = 64 * 1024;

  // ---- the direct path: collectives on node-shared buffers (shm/shared_buffers.cc)

  // A piece: its sum is copied from the cache into the other ranks' outputs, so it must
  // stay there, and every piece costs a turn of the shared counter (more ranks than
  // cores). Measured with the shared counter for every group size, 2 ranks in place, f32
  // sum, 4 / 16 MiB: 8 KiB pieces 130 / 1074 us, 32 KiB 140 / 866 us, 64 KiB 157 / 839 us,
  // 128 KiB 115 / 910 us, 256 KiB 255 / 1044 us (a noisy machine: within the noise from
  // 32 to 128 KiB). Calls smaller than two pieces per rank are cut finer
  // (shared_buffers.cc: piece_elems()).
  size_t shared_buffer_piece_bytes = 64 * 1024;

  // ---- direct shared memory through cross-memory attach (NodeGroup::cma())

  // Broadcasts, allgathers (by their result) and reduce-scatters (by their input) from
  // these sizes up read the root's or the peers' buffers with cross-memory attach when it
  // is available, at any size: one copy, through the kernel, against two through the
  // segment, the root's and then the others'. Measured on 2 ranks (f32, out of place):
  // broadcast 256 KiB 25.6 -> 14.9 us, 4 MiB 643 -> 396 us, 256 MiB 68-74 -> 64-66 ms;
  // allgather 256 KiB 27 -> 15 us, 4 MiB 525-548 -> 359-391 us, 256 MiB 48-59 -> 45-46
  // ms; reduce-scatter 256 KiB 28.9 -> 14.0 us, 4 MiB 631 -> 405 us, 64 MiB 16.8 -> 13.9
  // ms. Below, the system call costs more than the copy it saves.
  size_t cma_broadcast_min_bytes = 64 * 1024;
  size_t cma_allgather_min_bytes = 32 * 1024;
  size_t cma_reduce_scatter_min_bytes = 32 * 1024;
  // A reduce through cross-memory attach leaves all the work to the root: it pays from
  // 8 KiB (64 KiB: 13.2 -> 7.4-7.8 us, 512 KiB: 88 -> 64 us) but not from 1 MiB on, where
  // the segment path's sharing of the reductions wins (1 MiB: 195 against 217 us, 4 MiB:
  // 714 against 807 us, 256 MiB: 65 against 106 ms).
  size_t cma_reduce_min_bytes = 8 * 1024;
  size_t cma_reduce_max_bytes = 1024 * 1024;
  // The pieces a rank reads its peers' inputs in: small enough to stay in cache between
  // the read and the reduction.
  size_t cma_piece_bytes = 128 * 1024;
  // An alltoallv rank that sends at most this many bytes puts them in the segment, where
  // its peers copy them without a system call; above, they read its buffer through the
  // kernel.
  size_t alltoallv_segment_bytes = 32 * 1024;

  // ---- hierarchical: what runs inside a call (communicator/plan.cc,
  // hierarchical_choice(); algorithms/hierarchical.cc runs it)

  // Message sizes at which the cross-node phases switch from latency- to
  // bandwidth-optimal algorithms: the thresholds measured over loopback on two nodes,
  // before the cost model chose flat algorithms. They hold where they were measured:
  // the allreduce between two nodes (on the rank's block of the node's reduce-scatter):
  // recursive doubling up to hier_allreduce_small_bytes, halving-doubling up to
  // hier_allreduce_halving_bytes, the ring beyond; the broadcast among groups of at
  // most tree_limit_max_ranks (between nodes, and inside one over tcp): binomial tree up
  // to hier_broadcast_small_bytes, chain beyond. More nodes choose by the cost formulas
  // (communicator/cost_model.h), which put the ring's 2(N - 1) latencies against
  // log2 N ones.
  size_t hier_allreduce_small_bytes = 32 * 1024;
  size_t hier_allreduce_halving_bytes = 1024 * 1024;
  size_t hier_broadcast_small_bytes = 64 * 1024;
  // Allreduce chunks of the pipeline that overlaps the node phases with the exchange
  // between nodes (hierarchical.cc: allreduce_pipelined); calls of up to this many
  // bytes run the phases one after the other, whole. Small chunks leave less work
  // outside the overlap (the first chunk's reduction and the last one's distribution),
  // large ones pay fewer phases. 2 hosts x 2 ranks of the namespace cluster, 1 Gbit/s
  // tbf, share of the link in two runs, chunks of 128 KiB / 256 KiB / 512 KiB / 1 MiB
  // / 2 MiB: 4 MiB 0.95,0.88 / 0.95,0.95 / 0.94,0.92 / 0.93,0.92 / 0.90,0.84; 16 MiB
  // 0.95,0.95 / 0.95,0.95 / 0.95,0.95 / 0.94,0.94 / 0.90,0.88; 64 MiB 0.94,0.94 /
  // 0.95,0.93 / 0.95,0.95 / 0.95,0.95 / 0.95,0.93; unpipelined 4 MiB 0.90, 16 MiB 0.85.
  // Over the unshaped veth, best of 3 runs (single runs varied by up to 2x), 256 KiB
  // chunks against none: 1 MiB 1080 against 1112 us, 4 MiB 5370 against 6959 us,
  // 16 MiB 25.2 against 26.5 ms; from 32 MiB the medians of another 3 runs were 5-17%
  // slower (128-1024 chunks: performance.md, "The pipelined hierarchical allreduce");
  // capping the chunks (hier_max_chunks) made it slower still.
  size_t hier_chunk_bytes = 256 * 1024;
  // At most this many chunks per call (a count, not bytes): larger calls take chunks of
  // count / hier_max_chunks elements (rounded up). The default caps nothing below 1 GiB
  // of f32: a cap did not pay. Same binary, no cap / 64 / 256, 2 hosts x 2 ranks,
  // median ms: unshaped veth (6 runs / 6 / 3; single runs spread up to 2x) 16 MiB 20.2
  // / 23.0 / 20.6, 64 MiB 75.6 / 105 / 75.2, 128 MiB 162 / 203 / 204, 256 MiB 336 / 389
  // / 385; 1 Gbit/s tbf (2 runs, no cap / 64) 64 MiB 577 / 564, 256 MiB 2309 / 2264
  // (0.93 / 0.95 of the link). Performance.md, "The pipelined hierarchical allreduce".
  size_t hier_max_chunks = 4096;

  // ---- flat broadcast and reduce over tcp (communicator/plan.cc)

  // Measured cut-off the choice uses where no cost formula is written (chorus-bench, 2-8
  // ranks over loopback): broadcast and reduce over tcp take the binomial tree up to
  // this many bytes and the pipelined chain beyond, where bandwidth dominates.
  size_t tree_limit_bytes = 64 * 1024;
  // The largest group tree_limit_bytes (and hier_broadcast_small_bytes), the direct
  // gather and scatter and reduce_scatter_halving_max_bytes hold for: the groups they
  // were measured on (2-8 ranks). Larger groups choose by the cost formulas, which weigh
  // the chain's N - 1 latencies (9.2 ms at 1,024 ranks with the built-in alpha of 9 us)
  // against the tree's log2 N copies of the bytes, and the direct root's N - 1
  // messages against the binomial tree's log2 N rounds.
  size_t tree_limit_max_ranks = 8;
  // On those groups gather and scatter over tcp are direct (the root talks to every
  // rank), and reduce_scatter takes recursive halving up to this many bytes of input
  // and the ring beyond. bench/compare_builds.sh over tcp, best of 3 alternating
  // rounds, the cost model's choice (binomial gather and scatter, halving at every
  // size) against the direct and ring ones before it: 8 ranks, gather 0 B-128 KiB
  // 1.5-4.1x slower, scatter 1.2-2.3x; reduce_scatter's halving 0.36-0.46x the
  // ring's time up to 32 KiB and 0.71-0.84x at 128 KiB, but 1.6-2.0x at 512 KiB and
  // 2 MiB (4 ranks: 0.59-0.77 to 128 KiB, 1.55-1.58 from 512 KiB; 2 ranks 0.53-0.81,
  // then 1.14-1.25). In an 8-process job on 2 cores, a tree's rounds each wait for
  // a process to be scheduled, where the root's direct messages all cross at once.
  size_t reduce_scatter_halving_max_bytes = 256 * 1024;

  // ---- flat allreduce over tcp (communicator/cost_model.cc: cheapest())

  // Two ranks take recursive doubling (one exchange of everything) instead of
  // halving-doubling (two exchanges of half, the second waiting for the first's
  // reduction) up to this many bytes, where the cost formulas put the cut near 144 KiB.
  // In-place f32 over loopback, chorus-bench, median us of 4-8 interleaved rounds in
  // four sets: 256 KiB 74-91 against 88-100 (every set), 512 KiB 142 against 143 (one);
  // 1 MiB 226-282 against 229-238, where halving-doubling's halved reduction wins.
  // The automatic choice before and after, 6 rounds: 256 KiB 158 -> 100 us, 512 KiB
  // 208 -> 127 us (Open MPI, MPI_IN_PLACE over btl tcp: 225 and 264 us).
  size_t pair_rd_max_bytes = 512 * 1024;

  // ---- the plan: what a call runs at issue (communicator/plan.cc)

  // The largest allreduce the inline path runs through the segment on the calling
  // thread, when the progress engine is idle (one chunk reduced whole: 8-byte
  // allreduces, 2 ranks, 7 alternating runs: median 0.68 -> 0.52 us a call against
  // queueing it).
  size_t inline_bytes = 4096;
  // Polls of the peers' arrivals (a pause of some 20 ns each here) before the rest of an
  // operation begun at issue is left to the queue: issuing never blocks longer.
  size_t inline_polls = 128;
  // The largest allreduce on node-shared buffers run whole at issue. Larger ones stay
  // queued, so that a caller that issues them and goes on computing (DDP's buckets
  // during backward) overlaps them with its work; up to here an allreduce takes a few
  // microseconds (64 KiB, 2 ranks: 2.3), which the queue's bookkeeping and the
  // hand-over to the caller's wait() lengthened by a tenth. Where the node has no core
  // to spare, larger ones are entered at issue and their pieces left to the queue
  // (algorithms.h: shared_allreduce_arrives_at_issue()).
  size_t shared_allreduce_at_issue_bytes = 256 * 1024;

  // ---- waiting (communicator/progress_engine.h, transport/shm/layout.h)

  // How long the progress thread leaves a newly issued operation to a caller that may
  // be about to wait for it and run it itself, yielding meanwhile: woken by the call,
  // the thread often ran before the caller got there (on one of 2 ranks in a loop of
  // waited 64 KiB allreduces it ran 49,960 of 50,000, with a sleep and a wake-up each).
  size_t claim_grace_us = 50;
  // The same where every core of the node is taken by its ranks (asleep, not
  // yielding): chorus-mnist's first bucket is issued some 2 ms before its backward pass
  // ends and the rank waits for it.
  size_t no_spare_core_claim_grace_us = 5000;
  // A shared-memory waiter with a core of its own spins this many pauses (yielding
  // every 64) before it sleeps on the futex.
  size_t shm_spins = 20000;
  // With more local ranks than cores a waiter yields instead, this many times, before
  // it sleeps; while the ranks it waits for were last seen on other cores it first
  // spins shm_oversubscribed_spins pauses (about 19 ns each here) before each yield:
  // 4 ranks on 2 cores, allreduce 64 B-4 KiB: 12.5-14.0 -> 8.8-10.7 us.
  size_t shm_oversubscribed_yields = 64;
  size_t shm_oversubscribed_spins = 250;

  // The smallest chunk a shared-memory allreduce may take (shared_chunk_bytes,
  // pair_chunk_bytes): it must hold an element of every type, and a cache line.
  static constexpr size_t kMinChunkBytes = 64;
};

// The measured defaults, for contexts built without a cost model (tests, the
// communicator's own set-up barrier).
inline constexpr Tuning kDefaultTuning{};

}  // namespace chorus::algorithms
