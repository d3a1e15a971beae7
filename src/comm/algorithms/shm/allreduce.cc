// Direct shared-memory allreduce (helpers.h says how the direct collectives move data).
//
// allreduce, two ranks: chunks of up to Tuning::pair_whole_bytes each rank copies in
// and, after one phase, reduces whole from both ranks' buffers, in rank order, into its
// output. Larger chunks (Tuning::pair_chunk_bytes) go in slices: each rank copies in
// only the half of the chunk its peer reduces and, after one phase, reduces its own half
// from its own input, where it is, and the peer's copy, into its output and its buffer;
// after a second phase it copies the peer's half of the result out. Each rank then
// moves about four passes of half the chunk instead of five of the whole one, in place
// or not. Every element is reduced once, in rank order, so both ranks get the same
// bytes.
// allreduce, more ranks: each rank copies its chunk in and, after one phase, the ranks
// share the reduction out in pieces (NodeGroup's shared work): whichever rank runs takes
// the next piece, reduces it from every rank's buffer, in rank order, into local rank
// 0's buffer (in place: that piece is read by nobody else), and once every piece is
// done, every rank copies the whole result out. Every piece is computed once, so all
// ranks get the same bytes. With more ranks than cores, the ranks that hold the cores
// do the reductions of those waiting for one, instead of each rank doing a share in
// its turn. With more than two ranks per core (see Tuning::whole_crowded_bytes for
// why), each rank copies in all of its chunk but its own slice, reduces its slice from
// its own input and every other rank's buffer, in rank order, into its own buffer, and
// after a second phase every rank copies all slices out.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/shm/helpers.h"

namespace chorus::algorithms {

using transport::wire_code;
using transport::shm::NodeGroup;
using shm::average;
using shm::copy_slices;
using shm::reduce_all;
using shm::reduce_own_slice;
using shm::reduce_ranks;
using shm::stream_copy;
using shm::stream_done;

namespace {

// One chunk of a pair's allreduce in slices (the header says how): n elements from
// `in` to `out`, through buffer b.
void pair_slices(const Context& ctx, NodeGroup& g, int b, const uint8_t* in, uint8_t* out,
                 size_t n, bool avg, bool stream) {
  const size_t e = ctx.elem;
  const int me = g.local_rank(), peer = 1 - me;
  const size_t mine = block_begin(n, 2, me), mine_n = block_count(n, 2, me);
  const size_t theirs = block_begin(n, 2, peer), theirs_n = block_count(n, 2, peer);
  std::memcpy(g.buffer(me, b) + theirs * e, in + theirs * e, theirs_n * e);
  g.arrive();
  g.wait_all();
  // In place, `result` is this rank's input: each element is read before it is written.
  uint8_t* result = out + mine * e;
  reduce_all(ctx, g, b, mine, mine_n, result, in + mine * e);
  average(ctx, result, mine_n, avg);
  std::memcpy(g.buffer(me, b) + mine * e, result, mine_n * e);
  g.arrive();
  g.wait_all();
  if (stream) stream_copy(out + theirs * e, g.buffer(peer, b) + theirs * e, theirs_n * e);
  else std::memcpy(out + theirs * e, g.buffer(peer, b) + theirs * e, theirs_n * e);
}

// The reduction of the chunk in every rank's buffer b (n elements), shared out in
// pieces among the ranks that run, into local rank 0's buffer b; returns once every
// piece is done.
const uint8_t* reduce_shared(const Context& ctx, NodeGroup& g, int b, size_t n, bool avg) {
  const size_t e = ctx.elem;
  const size_t piece = std::max<size_t>(1, ctx.tuning.shared_piece_bytes / e);
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

// The largest chunk an allreduce is cut into on this node.
size_t chunk_bytes_of(const Tuning& t, const NodeGroup& g) {
  size_t chunk_bytes = g.buffer_bytes();
  if (g.local_size() == 2) chunk_bytes = std::min(chunk_bytes, t.pair_chunk_bytes);
  else if (!g.crowded()) chunk_bytes = std::min(chunk_bytes, t.shared_chunk_bytes);
  return chunk_bytes;
}

// The largest chunk of more than two ranks that every rank reduces whole (from every
// rank's buffer) rather than sharing the work out or reducing its own slice.
size_t whole_bytes_of(const Tuning& t, const NodeGroup& g) {
  return g.crowded() ? t.whole_crowded_bytes : g.oversubscribed() ? t.whole_oversubscribed_bytes : t.whole_bytes;
}

// The reduction of a small allreduce, every rank's data in rank order into `out`: from
// the arrivals' lines (b < 0) or from every rank's buffer b.
void reduce_small(const Context& ctx, const NodeGroup& g, int b, size_t n, uint8_t* out, bool avg) {
  if (b >= 0) reduce_all(ctx, g, b, 0, n, out);
  else reduce_ranks(ctx, g.local_size(), n, out, [&](int r) { return g.small_data(r); });
  average(ctx, out, n, avg);
}

}  // namespace

bool shm_allreduce_small(const Tuning& t, const NodeGroup& g, size_t bytes) {
  if (bytes == 0 || bytes > chunk_bytes_of(t, g)) return false;
  if (g.local_size() == 2) return bytes <= t.pair_whole_bytes;
  return bytes <= whole_bytes_of(t, g);
}

bool shm_allreduce_small_start(const Context& ctx, NodeGroup& g, const void* in, void* out,
                               size_t count, bool avg, int polls, int& b) {
  const size_t bytes = count * ctx.elem;
  g.expect(wire_code(Collective::kAllreduce));
  if (bytes <= NodeGroup::kSmallBytes) {
    b = -1;
    g.arrive_small(in, bytes);
  } else {
    b = g.next_buffer();
    std::memcpy(g.buffer(g.local_rank(), b), in, bytes);
    g.arrive();
  }
  if (!g.poll_all(polls)) return false;
  reduce_small(ctx, g, b, count, static_cast<uint8_t*>(out), avg);
  return true;
}

void shm_allreduce_small_finish(const Context& ctx, NodeGroup& g, int b, void* out, size_t count,
                                bool avg) {
  g.wait_all();
  reduce_small(ctx, g, b, count, static_cast<uint8_t*>(out), avg);
}

void shm_allreduce(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count,
                   bool avg) {
  if (count == 0) return;
  const size_t e = ctx.elem;
  if (shm_allreduce_small(ctx.tuning, g, count * e)) {
    // The inline path's protocol (the communicator may run either for the same call).
    int b = 0;
    if (!shm_allreduce_small_start(ctx, g, in, out, count, avg, 0, b)) {
      shm_allreduce_small_finish(ctx, g, b, out, count, avg);
    }
    return;
  }
  const int me = g.local_rank();
  const bool pair = g.local_size() == 2, sliced = g.crowded();
  const size_t chunk = chunk_bytes_of(ctx.tuning, g) / e;
  const Tuning& t = ctx.tuning;
  const size_t whole_bytes = whole_bytes_of(t, g);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAllreduce));
  const bool stream = count * e >= ctx.tuning.stream_bytes;
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const int b = g.next_buffer();
    if (pair && n * e > t.pair_whole_bytes) {
      pair_slices(ctx, g, b, src + at * e, dst + at * e, n, avg, stream);
      continue;
    }
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

}  // namespace chorus::algorithms
