// What several direct shared-memory collectives share (helpers.h).
#include "comm/algorithms/shm/helpers.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace chorus::algorithms::shm {

namespace {

// Copies elements [0, n) of `src` to `dst` except [skip, skip + skip_n).
void copy_around(uint8_t* dst, const uint8_t* src, size_t n, size_t skip, size_t skip_n,
                 size_t e) {
  std::memcpy(dst, src, skip * e);
  std::memcpy(dst + (skip + skip_n) * e, src + (skip + skip_n) * e, (n - skip - skip_n) * e);
}

}  // namespace

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

void reduce_all(const Context& ctx, const NodeGroup& g, int b, size_t at, size_t n, uint8_t* dst,
                const uint8_t* own) {
  const size_t off = at * ctx.elem;
  reduce_ranks(ctx, g.local_size(), n, dst, [&](int r) -> const uint8_t* {
    return own != nullptr && r == g.local_rank() ? own : g.buffer(r, b) + off;
  });
}

void average(const Context& ctx, void* buf, size_t n, bool on) {
  if (on) finish_avg(buf, n, ctx.dtype, ctx.size);
}

void reduce_own_slice(const Context& ctx, NodeGroup& g, int b, const uint8_t* in, size_t n,
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

void copy_slices(const Context& ctx, const NodeGroup& g, int b, size_t n, uint8_t* out,
                 bool stream) {
  const size_t e = ctx.elem;
  const int p = g.local_size();
  for (int r = 0; r < p; ++r) {
    const size_t from = block_begin(n, p, r), bytes = block_count(n, p, r) * e;
    if (stream) stream_copy(out + from * e, g.buffer(r, b) + from * e, bytes);
    else std::memcpy(out + from * e, g.buffer(r, b) + from * e, bytes);
  }
}

void cma_reduce_slice(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* dst,
                      size_t mine, size_t mine_n, bool avg) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), p = g.local_size();
  const size_t piece = std::max<size_t>(1, ctx.tuning.cma_piece_bytes / e);
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

void read_blocks(const Context& ctx, NodeGroup& g, const uint8_t* in, uint8_t* out,
                 const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  const size_t e = ctx.elem;
  const int me = g.local_rank();
  for (int r = 0; r < g.local_size(); ++r) {
    if (r != me && counts[r] > 0) g.read_peer(r, g.peer_in(r), out + displs[r] * e, counts[r] * e);
  }
  uint8_t* own = out + displs[me] * e;
  if (own != in && counts[me] > 0) std::memmove(own, in, counts[me] * e);
}

}  // namespace chorus::algorithms::shm
