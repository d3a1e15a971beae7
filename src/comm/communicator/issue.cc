// Issuing a planned call (plan.h): queued, or, where the plan says it starts at issue,
// run by the thread that issues it when the progress engine is idle
// (CommunicatorImpl::issue_inline()): small collectives on one node in shared memory.
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

namespace chorus::communicator {

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

Work CommunicatorImpl::issue(const OpSpec& spec, Call call) {
  call.elem = dtype_size(spec.dtype);
  const Plan plan = plan_for(call);
  if (plan.start == Start::kAtIssue) {
    const AtIssue attempt = plan.at_issue();
    std::optional<Work> w = issue_inline(spec, [&](const algorithms::Context& ctx, OpBody& rest) {
      return attempt(ctx, call, rest);
    });
    if (w) return std::move(*w);
  }
  return enqueue(spec, plan.body(std::move(call)));
}

}  // namespace chorus::communicator
