// Direct shared-memory collectives for the ranks of one node (docs/design.md, "direct
// shared memory"). Data goes through each rank's buffers in the group's segment in
// chunks of at most one buffer, alternating between a rank's two buffers (see
// shm_group.h for why that is safe); every chunk starts with "copy in, arrive, wait".
//
// allreduce, two ranks (or small chunks, see kWholeBytes): each rank copies its chunk in
// and, after one phase, reduces the whole chunk from every rank's buffer, in rank
// order, into its output. All ranks add the same numbers in the same order, so all get
// the same bytes. Chunks are half a buffer (kWholeChunkBytes), so that a rank's copy is
// still in its cache when the peer reads it.
// allreduce, more ranks: each rank copies its chunk in and, after one phase, the ranks
// share the reduction out in pieces (ShmGroup's shared work): whichever rank runs takes
// the next piece, reduces it from every rank's buffer, in rank order, into local rank
// 0's buffer (in place: that piece is read by nobody else), and once every piece is
// done, every rank copies the whole result out. Every piece is computed once, so all
// ranks get the same bytes. With more ranks than cores, the ranks that hold the cores
// do the reductions of those waiting for one, instead of each rank doing a share in
// its turn. With more than two ranks per core (see kWholeCrowdedBytes for why), each
// rank copies in all of its chunk but its own slice, reduces its slice from its own
// input and every other rank's buffer, in rank order, into its own buffer, and after a
// second phase every rank copies all slices out.
//
// Where the ranks can read each other's memory (ShmGroup::cma()), broadcasts,
// allgathers and reduce-scatters skip the segment from small sizes up: the other ranks
// read the root's data, or each peer's block, straight into their outputs (with
// process_vm_readv), or reduce their block from the peers' inputs, read into
// cache-sized pieces; so do reduces of up to 1 MiB, on the root. Gather, scatter,
// alltoall, alltoallv and allgatherv run here only that way.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "comm/algorithms/algorithms.h"
#include "comm/transport/shm/shm_group.h"

namespace chorus::algorithms {
namespace {

using transport::wire_code;
using transport::shm::ShmGroup;

// Allreduce chunks of up to this many bytes, in groups of more than two, are reduced
// whole by every rank instead of shared out: no wait for the pieces, no copy out of the
// result. With more ranks than cores (kWholeOversubscribedBytes) the ranks that wait for
// a core cost a switch each anyway. Measured with 4 ranks on 2 cores (bound to them),
// whole against shared: 8 KiB 9.3 against 11.7-12.0 us, 16 KiB 11.3 against 12.8-13.4
// us, 32 KiB 14.9 against 16.3-16.7 us, 64 KiB 23.0 against 19.9-20.8 us (slower).
constexpr size_t kWholeBytes = 8 * 1024;
constexpr size_t kWholeOversubscribedBytes = 32 * 1024;
// With more than two ranks per core (ShmGroup::crowded()) the shared reduction was
// slower than slices, from 64 KiB to 256 KiB in one chunk (8 ranks on 2 cores: 64 KiB
// 124 -> 151 us, 128 KiB 145 -> 290 us, 256 KiB 211 -> 457 us; 6 ranks: 256 KiB 148 ->
// 259 us), and faster only from 512 KiB (8 ranks: 1 MiB 621 -> 575 us). Such groups
// keep the sliced path, in buffer-sized chunks, with chunks of up to 64 KiB reduced
// whole (8 ranks, 64 KiB: 124 us whole).
constexpr size_t kWholeCrowdedBytes = 64 * 1024;
// Chunks of a shared reduction: the 4 ranks' copies of a 256 KiB chunk (1 MiB) stay in
// the caches of 2 cores until the pieces are reduced; of a 1 MiB chunk they did not
// (4 ranks on 2 cores: 1 MiB 267 us in 256 KiB chunks, 433 us in 1 MiB chunks; 4 MiB
// 1107 against 1736 us).
constexpr size_t kSharedChunkBytes = 256 * 1024;
// Two ranks reduce every chunk whole, whatever its size, in chunks of this many bytes.
// Each rank reads its peer's whole chunk once, as it would read half the chunk and half
// the result with slices, but with one phase per chunk instead of two and no writes to
// lines the peer has just read. Measured against the sliced path (with cross-memory
// attach from 256 KiB to 32 MiB), 2 ranks on this 2-core machine: 64 KiB 18.7 -> 14.8-15.4
// us, 1 MiB 168 -> 109-122 us, 16 MiB 3277 -> 2508-2605 us, 256 MiB 49.8 -> 41.2 ms
// (512 KiB chunks; 256 KiB: 51.2 ms, 1 MiB: 77.9 ms, when the chunk no longer stays in
// the cache between the copy and the peer's read).
constexpr size_t kWholeChunkBytes = 512 * 1024;
// Results of at least this many bytes are written around the caches (streaming
// stores): they would not fit anyway, and a normal store first reads every line it
// writes, a third more memory traffic.
constexpr size_t kStreamBytes = 64 * 1024 * 1024;
// Broadcasts, allgathers (by their result) and reduce-scatters (by their input) from
// these sizes up read the root's or the peers' buffers with cross-memory attach when it
// is available, at any size: one copy, through the kernel, against two through the
// segment, the root's and then the others'. Measured on 2 ranks (f32, out of place):
// broadcast 256 KiB 25.6 -> 14.9 us, 4 MiB 643 -> 396 us, 256 MiB 68-74 -> 64-66 ms;
// allgather 256 KiB 27 -> 15 us, 4 MiB 525-548 -> 359-391 us, 256 MiB 48-59 -> 45-46
// ms; reduce-scatter 256 KiB 28.9 -> 14.0 us, 4 MiB 631 -> 405 us, 64 MiB 16.8 -> 13.9
// ms. Below, the system call costs more than the copy it saves.
constexpr size_t kCmaBroadcastMinBytes = 64 * 1024;
constexpr size_t kCmaAllgatherMinBytes = 32 * 1024;
constexpr size_t kCmaReduceScatterMinBytes = 32 * 1024;
// A reduce through cross-memory attach leaves all the work to the root: it pays from
// 8 KiB (64 KiB: 13.2 -> 7.4-7.8 us, 512 KiB: 88 -> 64 us) but not from 1 MiB on, where
// the segment path's sharing of the reductions wins (1 MiB: 195 against 217 us, 4 MiB:
// 714 against 807 us, 256 MiB: 65 against 106 ms).
constexpr size_t kCmaReduceMinBytes = 8 * 1024;
constexpr size_t kCmaReduceMaxBytes = 1024 * 1024;
// An alltoallv rank that sends at most this many bytes puts them in the segment, where
// its peers copy them without a system call; above, they read its buffer through the
// kernel.
constexpr size_t kAlltoallvSegmentBytes = 32 * 1024;
// Reductions of up to this many bytes read all sources in one pass (ReduceManyFn); larger
// ones one source after another, which was faster from 256 KiB up (4 sources, f32, two
// of them written by the other core: 64 KiB 6.8 -> 5.4-5.5 us in one pass, 256 KiB 22.6
// against 24.4 us, 1 MiB 109 against 115 us).
constexpr size_t kManyMaxBytes = 64 * 1024;
// A piece of a shared reduction: small enough that the ranks that run share a chunk
// out evenly, large enough that taking it costs little against reducing it (16 KiB
// pieces measured the same as 32 KiB ones, within noise, from 64 KiB to 4 MiB).
constexpr size_t kSharedPieceBytes = 32 * 1024;
// The pieces a rank reads its peers' inputs in: small enough to stay in cache between
// the read and the reduction.
constexpr size_t kCmaPieceBytes = 128 * 1024;

// memcpy with non-temporal stores where the CPU has them; stream_done() orders them
// before anything this thread publishes later.
void stream_copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
#if defined(__x86_64__)
  size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
  if (bytes < head + 64) return static_cast<void>(std::memcpy(dst, src, bytes));
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void stream_done() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// dst[0, n) = reduction over local ranks (in order) of buffer(r, b) at element `at`;
// `own`, when not null, stands for this rank's buffer (its data was not copied in).
void reduce_all(const Context& ctx, const ShmGroup& g, int b, size_t at, size_t n, uint8_t* dst,
                const uint8_t* own = nullptr) {
  const size_t off = at * ctx.elem;
  auto source = [&](int r) -> const uint8_t* {
    return own != nullptr && r == g.local_rank() ? own : g.buffer(r, b) + off;
  };
  const int p = g.local_size();
  if (p == 2 || ctx.reduce_many == nullptr || n * ctx.elem > kManyMaxBytes) {
    ctx.reduce(dst, source(0), source(1), n);
    for (int r = 2; r < p; ++r) ctx.reduce(dst, dst, source(r), n);
    return;
  }
  // In one pass over up to kManySources sources at a time; a further pass starts from
  // the result so far, which is the same arithmetic in the same order.
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

// Copies elements [0, n) of `src` to `dst` except [skip, skip + skip_n).
void copy_around(uint8_t* dst, const uint8_t* src, size_t n, size_t skip, size_t skip_n,
                 size_t e) {
  std::memcpy(dst, src, skip * e);
  std::memcpy(dst + (skip + skip_n) * e, src + (skip + skip_n) * e, (n - skip - skip_n) * e);
}

void average(const Context& ctx, void* buf, size_t n, bool on) {
  if (on) finish_avg(buf, n, ctx.dtype, ctx.size);
}

// The first phase of a large chunk (n elements of `in`, buffer b): this rank publishes
// all of its chunk but its own slice, waits for every rank, reduces its slice from its
// own input and the others' buffers into its own buffer, and announces that.
void reduce_own_slice(const Context& ctx, ShmGroup& g, int b, const uint8_t* in, size_t n,
                      bool avg) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const size_t mine = block_begin(n, p, me), mine_n = block_count(n, p, me);
  copy_around(g.buffer(me, b), in, n, mine, mine_n, e);
  g.arrive();
  g.wait_all();
  uint8_t* slice = g.buffer(me, b) + mine * e;
  reduce_all(ctx, g, b, mine, mine_n, slice, in + mine * e);
  average(ctx, slice, mine_n, avg);
  g.arrive();
}

// The reduction of the chunk in every rank's buffer b (n elements), shared out in
// pieces among the ranks that run, into local rank 0's buffer b; returns once every
// piece is done.
const uint8_t* reduce_shared(const Context& ctx, ShmGroup& g, int b, size_t n, bool avg) {
  const size_t e = ctx.elem;
  const size_t piece = std::max<size_t>(1, kSharedPieceBytes / e);
  uint8_t* result = g.buffer(0, b);
  g.begin_work((n + piece - 1) / piece);
  for (int64_t k; (k = g.take_piece()) >= 0;) {
    const size_t at = static_cast<size_t>(k) * piece, m = std::min(piece, n - at);
    reduce_all(ctx, g, b, at, m, result + at * e);
    average(ctx, result + at * e, m, avg);
    g.finish_piece();
  }
  g.wait_work();
  return result;
}

// Every rank's slice of the chunk (n elements, buffer b), from its owner's buffer to
// its place in `out`.
void copy_slices(const Context& ctx, const ShmGroup& g, int b, size_t n, uint8_t* out,
                 bool stream) {
  const size_t e = ctx.elem;
  const int p = g.local_size();
  for (int r = 0; r < p; ++r) {
    const size_t from = block_begin(n, p, r), bytes = block_count(n, p, r) * e;
    if (stream) stream_copy(out + from * e, g.buffer(r, b) + from * e, bytes);
    else std::memcpy(out + from * e, g.buffer(r, b) + from * e, bytes);
  }
}

// Elements [mine, mine + mine_n) of the reduction of every local rank's published
// input, in rank order, into `dst` (which stands for element `mine`): peers' pieces
// are read with cross-memory attach into cache-sized scratch, this rank's own are used
// where they are. The caller has published `in` and passed the first phase.
void cma_reduce_slice(const Context& ctx, ShmGroup& g, const uint8_t* in, uint8_t* dst,
                      size_t mine, size_t mine_n, bool avg) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const size_t piece = std::max<size_t>(1, kCmaPieceBytes / e);
  uint8_t* tmp[3] = {ctx.scratch.get(3 * piece * e, 2), nullptr, nullptr};
  tmp[1] = tmp[0] + piece * e;
  tmp[2] = tmp[1] + piece * e;
  // In place, the partial sums overwrite this rank's input before ranks after the first
  // two are added: from local rank 2 on, the rank's own piece is added from a copy.
  const bool own_copy = dst == in + mine * e && me >= 2;
  for (size_t at = mine; at < mine + mine_n; at += piece) {
    const size_t n = std::min(piece, mine + mine_n - at);
    if (own_copy) std::memcpy(tmp[2], in + at * e, n * e);
    // Local rank r's elements [at, at + n): this rank's own input, or a copy of a peer's.
    auto source = [&](int r, int t) -> const uint8_t* {
      if (r == me) return own_copy ? tmp[2] : in + at * e;
      g.read_peer(r, g.peer_in(r) + at * e, tmp[t], n * e);
      return tmp[t];
    };
    uint8_t* out = dst + (at - mine) * e;
    const uint8_t* a = source(0, 0);
    const uint8_t* b = source(1, 1);
    ctx.reduce(out, a, b, n);
    for (int r = 2; r < p; ++r) ctx.reduce(out, out, source(r, 0), n);
    average(ctx, out, n, avg);
  }
}

// The two phases of a collective through cross-memory attach: this rank publishes its
// buffers and waits until every rank has, runs `body` (which may read the peers'
// buffers), then arrives and waits until every rank is done reading, so that none
// returns, and lets its buffers change, while another still reads them.
template <class Body>
void with_published_buffers(ShmGroup& g, const void* in, void* out, Body&& body) {
  g.publish_buffers(in, out);
  g.arrive();
  g.wait_all();
  body();
  g.arrive();
  g.wait_all();
}

// Reads every peer r's input (counts[r] elements) to displacement displs[r] of `out`
// and moves this rank's own `in` to its place unless it is already there (in place).
void read_blocks(const Context& ctx, ShmGroup& g, const uint8_t* in, uint8_t* out,
                 const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  const size_t e = ctx.elem;
  const int me = g.local_rank();
  for (int r = 0; r < g.local_size(); ++r) {
    if (r != me && counts[r] > 0) g.read_peer(r, g.peer_in(r), out + displs[r] * e, counts[r] * e);
  }
  uint8_t* own = out + displs[me] * e;
  if (own != in && counts[me] > 0) std::memmove(own, in, counts[me] * e);
}

// Reduce-scatter through cross-memory attach: this rank reduces its block from every
// rank's input into `out`; the second phase keeps the peers' inputs unchanged until
// every rank is done reading them.
void cma_reduce_scatter(const Context& ctx, ShmGroup& g, const uint8_t* in, uint8_t* out,
                        size_t total, bool avg) {
  const int me = g.local_rank(), p = g.local_size();
  with_published_buffers(g, in, out, [&] {
    cma_reduce_slice(ctx, g, in, out, block_begin(total, p, me), block_count(total, p, me), avg);
  });
}

// Reduce through cross-memory attach: the root reduces every element from the ranks'
// inputs, as the allreduce reduces its slice; the others only wait until it is done.
void cma_reduce(const Context& ctx, ShmGroup& g, const uint8_t* in, uint8_t* out, size_t count,
                int root) {
  with_published_buffers(g, in, out, [&] {
    if (g.local_rank() == root) cma_reduce_slice(ctx, g, in, out, 0, count, ctx.average);
  });
}

// Broadcast through cross-memory attach: the other ranks read the root's `send`
// straight into their buffers while the root copies it to its own (out of place). The
// second phase keeps the root from returning, and changing `send`, while they read.
void cma_broadcast(ShmGroup& g, const uint8_t* send, uint8_t* data, size_t bytes, int root) {
  const bool is_root = g.local_rank() == root;
  with_published_buffers(g, is_root ? send : data, data, [&] {
    if (!is_root) g.read_peer(root, g.peer_in(root), data, bytes);
    else if (send != data) std::memcpy(data, send, bytes);
  });
}

// Allgather through cross-memory attach: every rank reads each peer's block from the
// peer's input straight into its place in its own output, all ranks at once, instead
// of every block being copied into the segment and out again one after the other.
void cma_allgather(const Context& ctx, ShmGroup& g, const uint8_t* in, uint8_t* out,
                   size_t total) {
  const int p = g.local_size();
  std::vector<size_t> counts(p), displs(p);
  for (int r = 0; r < p; ++r) {
    counts[r] = block_count(total, p, r);
    displs[r] = block_begin(total, p, r);
  }
  with_published_buffers(g, in, out, [&] { read_blocks(ctx, g, in, out, counts, displs); });
}

}  // namespace

void shm_allreduce(const Context& ctx, ShmGroup& g, const void* in, void* out, size_t count,
                   bool avg) {
  if (count == 0) return;
  const size_t e = ctx.elem;
  const int me = g.local_rank();
  const bool pair = g.local_size() == 2, sliced = g.crowded();
  size_t chunk_bytes = g.buffer_bytes();
  if (pair) chunk_bytes = std::min(chunk_bytes, kWholeChunkBytes);
  else if (!sliced) chunk_bytes = std::min(chunk_bytes, kSharedChunkBytes);
  const size_t chunk = chunk_bytes / e;
  const size_t whole_bytes = sliced ? kWholeCrowdedBytes
                             : g.oversubscribed() ? kWholeOversubscribedBytes
                                                  : kWholeBytes;
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAllreduce));
  const bool stream = count * e >= kStreamBytes;
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    const bool whole = pair || n * e <= whole_bytes;
    if (sliced && !whole) {
      reduce_own_slice(ctx, g, b, src + at * e, n, avg);
      g.wait_all();
      copy_slices(ctx, g, b, n, dst + at * e, stream);
      continue;
    }
    std::memcpy(g.buffer(me, b), src + at * e, n * e);
    g.arrive();
    g.wait_all();
    if (whole) {
      reduce_all(ctx, g, b, 0, n, dst + at * e);
      average(ctx, dst + at * e, n, avg);
      continue;
    }
    const uint8_t* result = reduce_shared(ctx, g, b, n, avg);
    if (stream) stream_copy(dst + at * e, result, n * e);
    else std::memcpy(dst + at * e, result, n * e);
  }
  if (stream) stream_done();
}

void shm_reduce(const Context& ctx, ShmGroup& g, const void* in, void* out, size_t count,
                int root) {
  if (count == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const auto* src = static_cast<const uint8_t*>(in);
  const bool is_root = g.local_rank() == root;
  g.expect(wire_code(Collective::kReduce));
  if (g.cma() && count * e >= kCmaReduceMinBytes && count * e < kCmaReduceMaxBytes) {
    return cma_reduce(ctx, g, src, static_cast<uint8_t*>(out), count, root);
  }
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    // Slices are reduced into their owners' buffers, not into the root's output, which
    // may be the root's input; only the root then reads them.
    reduce_own_slice(ctx, g, b, src + at * e, n, ctx.average);
    // Every rank waits at every phase, also where it has nothing left to read: a rank
    // that went on to its next operation could otherwise publish that operation's
    // descriptor (in the slot of this chunk's first phase, two phases on) before a
    // slower rank had compared the descriptors of this one, which then failed with a
    // false "called a different collective" (issue 6's fault tests found it).
    g.wait_all();
    if (!is_root) continue;
    copy_slices(ctx, g, b, n, static_cast<uint8_t*>(out) + at * e, false);
  }
}

void shm_broadcast(const Context& ctx, ShmGroup& g, const void* send, void* buf, size_t count,
                   int root) {
  if (count == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const bool is_root = g.local_rank() == root;
  const auto* from = static_cast<const uint8_t*>(send);
  auto* data = static_cast<uint8_t*>(buf);
  g.expect(wire_code(Collective::kBroadcast));
  if (g.cma() && count * e >= kCmaBroadcastMinBytes) {
    return cma_broadcast(g, from, data, count * e, root);
  }
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    if (is_root) std::memcpy(g.buffer(root, b), from + at * e, n * e);
    g.arrive();
    g.wait_all();
    if (!is_root) std::memcpy(data + at * e, g.buffer(root, b), n * e);
    else if (from != data) std::memcpy(data + at * e, from + at * e, n * e);  // while they copy
  }
}

void shm_allgather_blocks(const Context& ctx, ShmGroup& g, const void* in, void* out,
                          size_t total) {
  if (total == 0) return;
  const size_t e = ctx.elem, chunk = g.buffer_bytes() / e;
  const int me = g.local_rank(), p = g.local_size();
  const size_t largest = block_count(total, p, 0);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAllgather));
  if (g.cma() && total * e >= kCmaAllgatherMinBytes) return cma_allgather(ctx, g, src, dst, total);
  for (size_t at = 0; at < largest; at += chunk) {
    const int b = g.next_buffer();
    const size_t my_n = std::min(chunk, block_count(total, p, me) - std::min(at, block_count(total, p, me)));
    std::memcpy(g.buffer(me, b), src + at * e, my_n * e);
    g.arrive();
    g.wait_all();
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      const size_t have = block_count(total, p, r);
      const size_t n = std::min(chunk, have - std::min(at, have));
      std::memcpy(dst + (block_begin(total, p, r) + at) * e, g.buffer(r, b), n * e);
    }
  }
  // `in` may already be out's own block; otherwise place it.
  uint8_t* own = dst + block_begin(total, p, me) * e;
  if (own != src) std::memmove(own, src, block_count(total, p, me) * e);
}

void shm_reduce_scatter_blocks(const Context& ctx, ShmGroup& g, const void* in, void* out,
                               size_t total, bool avg) {
  if (total == 0) return;
  const int me = g.local_rank(), p = g.local_size();
  const size_t e = ctx.elem, chunk = std::max<size_t>(1, g.buffer_bytes() / (e * p));
  const size_t largest = block_count(total, p, 0);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kReduceScatter));
  if (g.cma() && total * e >= kCmaReduceScatterMinBytes) {
    return cma_reduce_scatter(ctx, g, src, dst, total, avg);
  }
  for (size_t at = 0; at < largest; at += chunk) {
    const int b = g.next_buffer();
    // Pieces of every block go to slots of `chunk` elements in this rank's buffer.
    for (int r = 0; r < p; ++r) {
      const size_t have = block_count(total, p, r);
      const size_t n = std::min(chunk, have - std::min(at, have));
      std::memcpy(g.buffer(me, b) + r * chunk * e, src + (block_begin(total, p, r) + at) * e, n * e);
    }
    g.arrive();
    g.wait_all();
    const size_t have = block_count(total, p, me);
    const size_t n = std::min(chunk, have - std::min(at, have));
    if (n == 0) continue;
    reduce_all(ctx, g, b, me * chunk, n, dst + at * e);
    average(ctx, dst + at * e, n, avg);
  }
}

// Gather, scatter, alltoall(v) and allgatherv need cross-memory attach (g.cma()): each
// rank reads the blocks it receives straight from their owners' buffers, one copy each,
// and the last phase keeps every rank from returning while others may still read its
// buffers.
void shm_gather(const Context& ctx, ShmGroup& g, const void* in, void* out, size_t count,
                int root) {
  const int me = g.local_rank(), p = g.local_size();
  g.expect(wire_code(Collective::kGather));
  with_published_buffers(g, in, out, [&] {
    if (me != root || count == 0) return;
    std::vector<size_t> counts(p, count), displs(p);
    for (int r = 0; r < p; ++r) displs[r] = r * count;
    read_blocks(ctx, g, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), counts, displs);
  });
}

void shm_scatter(const Context& ctx, ShmGroup& g, const void* in, void* out, size_t count,
                 int root) {
  const size_t bytes = count * ctx.elem;
  const int me = g.local_rank();
  g.expect(wire_code(Collective::kScatter));
  with_published_buffers(g, in, out, [&] {
    if (bytes == 0) return;
    if (me != root) return g.read_peer(root, g.peer_in(root) + me * bytes, out, bytes);
    const uint8_t* mine = static_cast<const uint8_t*>(in) + me * bytes;
    if (mine != out) std::memmove(out, mine, bytes);  // in place: there
  });
}

void shm_alltoall(const Context& ctx, ShmGroup& g, const void* in, void* out, size_t count) {
  const size_t bytes = count * ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAlltoall));
  // In place, this rank overwrites the blocks its peers are reading: they read a copy.
  if (in == out && bytes > 0) {
    uint8_t* copy = ctx.scratch.get(bytes * p, 1);
    std::memcpy(copy, src, bytes * p);
    src = copy;
  }
  with_published_buffers(g, src, out, [&] {
    if (bytes == 0) return;
    for (int r = 0; r < p; ++r) {
      if (r != me) g.read_peer(r, g.peer_in(r) + me * bytes, dst + r * bytes, bytes);
    }
    if (src != dst) std::memmove(dst + me * bytes, src + me * bytes, bytes);
  });
}

// Every rank writes a table to its segment buffer: where its data is, then the count
// and displacement of what it sends to each rank and the count it expects from each.
// The data is in the buffer too, packed after the table, when this rank sends at most
// kAlltoallvSegmentBytes; otherwise the table holds the address of its send buffer
// (of a copy, in place), which the peers read with cross-memory attach. After one
// phase every rank reads all tables, so all find the same first disagreement without
// another exchange; when there is none, each copies the blocks it receives. A last
// phase, only when some rank's data is read through the kernel, keeps that rank from
// returning while the others read its buffer. Data in the segment needs none: the
// buffer is written again only after a later operation's phase that every rank must
// reach first (see shm_group.h).
int32_t shm_alltoallv(const Context& ctx, ShmGroup& g, const void* in,
                      const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                      void* out, const std::vector<size_t>& recv_counts,
                      const std::vector<size_t>& recv_displs, const CountsVerdict& verdict) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAlltoallv));
  const int b = g.next_buffer();
  // Table of rank r: [0] its send buffer's address, 0 when the data is in the segment;
  // [1 + 3q] count to rank q, [2 + 3q] displacement (in the segment: packed), [3 + 3q]
  // count it expects from rank q.
  auto table = [&](int r) { return reinterpret_cast<uint64_t*>(g.buffer(r, b)); };
  const size_t data_at = ((1 + 3 * static_cast<size_t>(p)) * sizeof(uint64_t) + 63) / 64 * 64;
  size_t total = 0, extent = 0;
  for (int q = 0; q < p; ++q) {
    total += send_counts[q];
    if (send_counts[q] > 0) extent = std::max(extent, send_displs[q] + send_counts[q]);
  }
  const bool in_segment = total * e <= kAlltoallvSegmentBytes &&
                          data_at + total * e <= g.buffer_bytes();
  uint64_t* mine = table(me);
  if (in_segment) {
    mine[0] = 0;
    size_t at = 0;
    for (int q = 0; q < p; ++q) {
      std::memcpy(g.buffer(me, b) + data_at + at * e, src + send_displs[q] * e, send_counts[q] * e);
      mine[2 + 3 * q] = at;
      at += send_counts[q];
    }
  } else {
    // In place, this rank overwrites the blocks its peers are reading: they read a copy.
    if (in == out && extent > 0) {
      uint8_t* copy = ctx.scratch.get(extent * e, 1);
      std::memcpy(copy, src, extent * e);
      src = copy;
    }
    mine[0] = reinterpret_cast<uintptr_t>(src);
    for (int q = 0; q < p; ++q) mine[2 + 3 * q] = send_displs[q];
  }
  for (int q = 0; q < p; ++q) {
    mine[1 + 3 * q] = send_counts[q];
    mine[3 + 3 * q] = recv_counts[q];
  }
  g.arrive();
  g.wait_all();
  // The first rank that expects from some rank other than what that rank sends it.
  int32_t first_bad = INT32_MAX;
  bool through_kernel = false;
  for (int q = 0; q < p && first_bad == INT32_MAX; ++q) {
    for (int r = 0; r < p; ++r) {
      if (table(r)[1 + 3 * q] != table(q)[3 + 3 * r]) {
        first_bad = q;
        break;
      }
    }
  }
  if (first_bad != INT32_MAX) {
    // This rank's own view, for its message (INT32_MAX unless it is the one).
    std::vector<uint64_t> announced(p);
    for (int r = 0; r < p; ++r) announced[r] = table(r)[1 + 3 * me];
    const int32_t own = verdict(announced);
    return own == INT32_MAX ? first_bad : own;
  }
  for (int r = 0; r < p; ++r) {
    const uint64_t* t = table(r);
    through_kernel |= t[0] != 0;
    if (recv_counts[r] == 0) continue;
    uint8_t* to = dst + recv_displs[r] * e;
    const size_t bytes = recv_counts[r] * e;
    if (t[0] == 0) std::memcpy(to, g.buffer(r, b) + data_at + t[2 + 3 * me] * e, bytes);
    else if (r != me) g.read_peer(r, t[0] + t[2 + 3 * me] * e, to, bytes);
    else if (to != src + send_displs[me] * e) std::memmove(to, src + send_displs[me] * e, bytes);
  }
  if (through_kernel) {
    g.arrive();
    g.wait_all();
  }
  return INT32_MAX;
}

void shm_allgatherv(const Context& ctx, ShmGroup& g, const void* in, void* out,
                    const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  const int p = g.local_size();
  // The ranks compare their calls' digests of the counts (Signature::count): a rank
  // that expects more from a peer than the peer sends must not read past it.
  uint64_t total = 0;
  for (int r = 0; r < p; ++r) total += counts[r];
  if (total == 0) return;
  g.expect(wire_code(Collective::kAllgatherv));
  with_published_buffers(g, in, out, [&] {
    read_blocks(ctx, g, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), counts, displs);
  });
}

void shm_barrier(const Context&, ShmGroup& g) {
  g.expect(wire_code(Collective::kBarrier));
  g.arrive();
  g.wait_all();
}

}  // namespace chorus::algorithms
