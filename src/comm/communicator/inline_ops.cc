// The inline path: small collectives on one node in shared memory, run by the thread
// that issues them when the progress engine is idle (CommunicatorImpl::issue_inline()).
//
// A collective of a few bytes costs its exchange between the ranks (some 0.07 us for
// two ranks here, measured with a bare two-process program) and the engine's
// bookkeeping around it: queueing, the runner role taken from the queue, the wake-up
// logic. Issued at once on the calling thread, it skips the queue. It still waits only
// a bounded number of polls for the peers: a peer that has not arrived by then leaves
// the rest of the operation queued first, to finish as any queued operation does (on
// Work::wait()'s thread or the progress thread). So issuing never blocks for longer
// than those polls, and an operation issued on two communicators in different orders
// on different ranks cannot deadlock, as it could if the call waited for its peers.
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/communicator_impl.h"

namespace chorus::internal {

namespace alg = chorus::algorithms;

namespace {

// Polls of the peers' arrivals (a pause of some 20 ns each here) before the rest of an
// inline operation is left to the queue.
constexpr int kInlinePolls = 128;
// The largest inline allreduce.
constexpr size_t kInlineBytes = 4096;

}  // namespace

template <class Attempt>
bool CommunicatorImpl::issue_inline(const OpSpec& spec, Work& work, Attempt&& attempt) {
  std::optional<Op> op;
  std::chrono::steady_clock::time_point at;
  if (!engine_.claim_inline(0, [&](uint64_t seq, std::chrono::steady_clock::time_point now) {
        at = now;
        op.emplace(make_op(spec, seq, now, nullptr, true));
      })) {
    return false;
  }
  work = Work(op->work);
  const transport::OpInfo info = op_info(*op, at);
  algorithms::Context ctx = context_for(spec);
  if (execute(
          *op,
          [&] {
            transport_->begin(info);
            return attempt(ctx, op->body);
          },
          &at)) {
    op.reset();
  } else {
    op->begun = true;
  }
  engine_.release_inline(std::move(op), at);
  return true;
}

std::optional<Work> CommunicatorImpl::allreduce_inline(const void* send, void* recv, size_t count,
                                                       const OpSpec& spec) {
  const size_t bytes = count * dtype_size(spec.dtype);
  // Not with more ranks than cores: a peer that has not arrived is waiting for this
  // core, so the call nearly always left its rest to the queue, and that cost more than
  // queueing it at once (4 ranks on 2 cores, 8 bytes: 10.2-13.3 us against 2.9-4.2).
  if (!options_.shm_inline || options_.check_consistency || !all_in_shared_memory() || bytes > kInlineBytes ||
      shm_->oversubscribed() || !alg::shm_allreduce_small(cost_.tuning, *shm_, bytes)) {
    return std::nullopt;
  }
  const int polls = kInlinePolls;
  Work work;
  const bool issued = issue_inline(spec, work, [&](const alg::Context& ctx, OpBody& rest) {
    int b = 0;
    if (alg::shm_allreduce_small_start(ctx, *ctx.node, send, recv, count, ctx.average, polls, b)) return true;
    rest = [=](const alg::Context& c) { alg::shm_allreduce_small_finish(c, *c.node, b, recv, count, c.average); };
    return false;
  });
  if (!issued) return std::nullopt;
  return work;
}

}  // namespace chorus::internal
