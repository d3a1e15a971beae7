// Direct shared-memory allreduce (helpers.h says how the direct collectives move data).
//
// allreduce, two ranks (or small chunks, see Tuning::whole_bytes): each rank copies its
// chunk in and, after one phase, reduces the whole chunk from every rank's buffer, in
// rank order, into its output. All ranks add the same numbers in the same order, so all
// get the same bytes. Chunks are half a buffer (Tuning::whole_chunk_bytes), so that a
// rank's copy is still in its cache when the peer reads it.
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
using shm::stream_copy;
using shm::stream_done;

namespace {

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

}  // namespace

void shm_allreduce(const Context& ctx, NodeGroup& g, const void* in, void* out, size_t count,
                   bool avg) {
  if (count == 0) return;
  const size_t e = ctx.elem;
  const int me = g.local_rank();
  const bool pair = g.local_size() == 2, sliced = g.crowded();
  size_t chunk_bytes = g.buffer_bytes();
  if (pair) chunk_bytes = std::min(chunk_bytes, ctx.tuning.whole_chunk_bytes);
  else if (!sliced) chunk_bytes = std::min(chunk_bytes, ctx.tuning.shared_chunk_bytes);
  const size_t chunk = chunk_bytes / e;
  const Tuning& t = ctx.tuning;
  const size_t whole_bytes = sliced               ? t.whole_crowded_bytes
                             : g.oversubscribed() ? t.whole_oversubscribed_bytes
                                                  : t.whole_bytes;
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  g.expect(wire_code(Collective::kAllreduce));
  const bool stream = count * e >= ctx.tuning.stream_bytes;
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

}  // namespace chorus::algorithms
