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
// The largest inline allreduce through the segment.
constexpr size_t kInlineBytes = 4096;

}  // namespace

template <class Attempt>
std::optional<Work> CommunicatorImpl::issue_inline(const OpSpec& spec, Attempt&& attempt) {
  uint64_t seq = 0;
  std::chrono::steady_clock::time_point at;
  if (!engine_.claim_inline(0, [&](uint64_t s, std::chrono::steady_clock::time_point now) {
        seq = s;
        at = now;
      })) {
    return std::nullopt;
  }
  // The operation's shared state (WorkState), its count among the unfinished and its
  // flight-recorder slot are made only when it outlives this call: when it stops short
  // of its peers or fails. One that completes here (nearly all) returns a Work that
  // carries its name and number alone, and is recorded once, done (8-byte allreduces,
  // 2 ranks, 7 alternating runs: median 0.68 -> 0.52 us a call).
  OpBody rest;
  bool done = false;
  std::exception_ptr error;
  try {
    algorithms::Context ctx = context_for(spec);
    transport_->begin(op_info(spec, seq, at));
    done = attempt(ctx, rest);
  } catch (...) {
    error = std::current_exception();
  }
  if (done) {  // not set when the attempt threw
    if (recorder_.enabled()) recorder_.done_at_once(seq, spec.what, spec.dtype, spec.count, spec.root, at);
    engine_.release_inline(std::nullopt);
    return Work(collective_name(spec.what), seq);
  }
  std::optional<Op> op(make_op(spec, seq, at, std::move(rest), true));
  Work work(op->work);
  if (error) {
    fail(*op, error);  // completes the Work with the error and aborts the communicator
    op.reset();
  } else {
    op->begun = true;  // what is left runs first, without beginning the operation again
  }
  engine_.release_inline(std::move(op));
  return work;
}

bool CommunicatorImpl::inline_allowed() const {
  return options_.shm_inline && !options_.check_consistency && all_in_shared_memory();
}

bool CommunicatorImpl::inline_possible() const {
  // Not with more ranks than cores: a peer that has not arrived is waiting for this
  // core, so the call nearly always left its rest to the queue, and that cost more than
  // queueing it at once (4 ranks on 2 cores, 8 bytes: 10.2-13.3 us against 2.9-4.2).
  return inline_allowed() && !shm_->oversubscribed();
}

std::optional<Work> CommunicatorImpl::allreduce_inline(const void* send, void* recv, size_t count,
                                                       const OpSpec& spec) {
  const size_t bytes = count * dtype_size(spec.dtype);
  if (bytes > kInlineBytes || !inline_possible() || !alg::shm_allreduce_small(cost_.tuning, *shm_, bytes)) {
    return std::nullopt;
  }
  return issue_inline(spec, [&](const alg::Context& ctx, OpBody& rest) {
    int b = 0;
    if (alg::shm_allreduce_small_start(ctx, *ctx.node, send, recv, count, ctx.average, kInlinePolls, b)) return true;
    rest = [=](const alg::Context& c) { alg::shm_allreduce_small_finish(c, *c.node, b, recv, count, c.average); };
    return false;
  });
}

// The direct path's allreduce at issue. Up to kSharedAllreduceAtIssueBytes: once every
// rank has entered it (the polls), the rest runs here too. That waits for the peers'
// pieces, but every peer is inside this very call by then, and one that left its own
// rest to its queue has its progress thread finish it: issuing still never waits on
// what a peer issues later, or on another communicator. Larger, where the node has no
// core to spare: the call is only entered here, and all of it is left to the queue,
// whose first runner on any rank does the pieces (shared_allreduce_arrives_at_issue()).
std::optional<Work> CommunicatorImpl::shared_allreduce_inline(const transport::shm::SharedRef& in,
                                                              const transport::shm::SharedRef& out,
                                                              size_t count, const OpSpec& spec) {
  const size_t bytes = count * dtype_size(spec.dtype);
  if (bytes > alg::kSharedAllreduceAtIssueBytes) {
    if (!inline_allowed() || !alg::shared_allreduce_arrives_at_issue(*shm_, bytes)) return std::nullopt;
    return issue_inline(spec, [&](const alg::Context& ctx, OpBody& rest) {
      alg::shared_allreduce_arrive(*ctx.node, in, out, count);
      rest = [=](const alg::Context& c) { alg::shared_allreduce_finish(c, *c.node, count, c.average); };
      return false;
    });
  }
  if (!inline_possible()) return std::nullopt;
  return issue_inline(spec, [&](const alg::Context& ctx, OpBody& rest) {
    if (alg::shared_allreduce_start(ctx, *ctx.node, in, out, count, ctx.average, kInlinePolls)) return true;
    rest = [=](const alg::Context& c) { alg::shared_allreduce_finish(c, *c.node, count, c.average); };
    return false;
  });
}

}  // namespace chorus::internal
