#include "comm/algorithms/ring_pipeline.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {
namespace {

// Receive slots for reduce-scatter segments. A slot is reused only once the send that
// forwarded its content has completed, and that send completes only when the right
// neighbour reads it: behind all of this rank's first-step segments (one chunk), which
// the neighbour reads one receive at a time. With fewer slots than a chunk has
// segments, every rank can end up waiting for a send while none posts a receive
// (a deadlock once a chunk outgrows the socket buffers). One slot more than the
// segments of a chunk means a rank only waits for a send that its neighbour read
// before reaching the item this rank is on, so some rank can always go on.
size_t slot_count(size_t segments_per_chunk) { return segments_per_chunk + 1; }

// Hands out receive slots: the most recently freed first, while it is still in cache
// (with 2 ranks, whose reduced segments are never forwarded from a slot, always the
// same one). When every slot is busy it waits for the oldest forwarding send, which is
// never more recent than the one a round-robin choice would wait for, so the
// argument above holds.
class SlotPool {
 public:
  SlotPool(transport::Transport& t, size_t count) : t_(t) {
    for (size_t k = count; k-- > 0;) free_.push_back(k);  // slot 0 on top
  }
  size_t take() {
    while (!busy_.empty() && t_.test(busy_.front().first)) release_oldest();
    if (free_.empty()) {
      t_.wait(busy_.front().first);
      release_oldest();
    }
    size_t s = free_.back();
    free_.pop_back();
    return s;
  }
  void give_back(size_t slot) { free_.push_back(slot); }
  // `slot` is free again once `send` (posted after every earlier one) completes.
  void busy_until(size_t slot, const transport::Request& send) { busy_.emplace_back(send, slot); }

 private:
  void release_oldest() {
    free_.push_back(busy_.front().second);
    busy_.pop_front();
  }
  transport::Transport& t_;
  std::vector<size_t> free_;
  std::deque<std::pair<transport::Request, size_t>> busy_;  // in the order posted
};

struct Segmenting {
  size_t count = 1;  // segments per chunk
  size_t bytes = 0;  // bytes per segment (a multiple of the element size)

  Segmenting(size_t max_chunk, size_t elem, size_t segment_bytes) {
    if (max_chunk == 0) return;
    count = (max_chunk + segment_bytes - 1) / segment_bytes;
    size_t per = (max_chunk + count - 1) / count;
    bytes = (per + elem - 1) / elem * elem;
  }
  // Byte offset and length of segment k within a chunk of `len` bytes.
  std::pair<size_t, size_t> range(size_t len, size_t k) const {
    size_t off = std::min(k * bytes, len);
    return {off, std::min(off + bytes, len) - off};
  }
};

}  // namespace

void run_ring(const Context& ctx, const RingPlan& plan) {
  const int n = ctx.size, r = ctx.rank;
  const int total_steps = plan.rs_steps + plan.ag_steps;
  if (total_steps == 0) return;
  transport::Transport& t = ctx.transport;
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const size_t max_chunk = *std::max_element(plan.len.begin(), plan.len.end());
  const Segmenting seg(max_chunk, ctx.elem, ctx.segment_bytes);
  const int rs = plan.rs_steps;

  auto send_chunk = [&](int step) {
    return step < rs ? mod(r - step - 1, n) : mod(r - (step - rs), n);
  };
  auto recv_chunk = [&](int step) {
    return step < rs ? mod(r - step - 2, n) : mod(r - (step - rs) - 1, n);
  };

  // Step 0's sends need nothing received first.
  int c0 = send_chunk(0);
  for (size_t k = 0; k < seg.count; ++k) {
    auto [off, len] = seg.range(plan.len[c0], k);
    const uint8_t* src = rs > 0 ? plan.in + plan.in_off[c0] + off : plan.own_src + off;
    t.isend(right, src, len);
  }

  const size_t n_slots = slot_count(seg.count);
  uint8_t* slots = rs > 0 ? ctx.scratch.get(n_slots * seg.bytes, 0) : nullptr;
  SlotPool pool(t, rs > 0 ? n_slots : 0);
  for (int step = 0; step < total_steps; ++step) {
    const int c = recv_chunk(step);
    const bool last = step + 1 == total_steps;
    for (size_t k = 0; k < seg.count; ++k) {
      auto [off, len] = seg.range(plan.len[c], k);
      if (step >= rs) {  // allgather: receive straight into place, forward from there
        uint8_t* dst = plan.out + plan.out_off[c] + off;
        t.wait(t.irecv(left, dst, len));
        if (!last) t.isend(right, dst, len);
        continue;
      }
      const size_t s = pool.take();
      uint8_t* slot = slots + s * seg.bytes;
      t.wait(t.irecv(left, slot, len));
      const bool own = step == rs - 1;  // this chunk is now fully reduced: it is ours
      uint8_t* dst = own ? plan.own_dst + off : slot;
      ctx.reduce(dst, plan.in + plan.in_off[c] + off, slot, len / ctx.elem);
      if (own) {
        finish_average(ctx, dst, len / ctx.elem);
        pool.give_back(s);  // reduced into place: nothing is sent from the slot
      }
      if (last) continue;
      transport::Request req = t.isend(right, dst, len);
      if (!own) pool.busy_until(s, req);
    }
  }
  t.wait_all();
}

void finish_average(const Context& ctx, void* buf, size_t count) {
  if (ctx.average && count > 0) chorus::finish_avg(buf, count, ctx.dtype, ctx.size);
}

}  // namespace chorus::algorithms
