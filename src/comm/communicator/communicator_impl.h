// The communicator behind the public interface: a transport, and a progress engine
// (progress_engine.h) that runs its operations in issue order.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/communicator.h"
#include "comm/algorithms/context.h"
#include "comm/communicator/cost_model.h"
#include "comm/communicator/flight_recorder.h"
#include "comm/communicator/plan.h"
#include "comm/communicator/progress_engine.h"
#include "comm/communicator/work_state.h"
#include "comm/transport/shm/shm_group.h"
#include "comm/transport/transport.h"

namespace chorus::store {
class KeyLedger;
}  // namespace chorus::store

namespace chorus::communicator {

struct OpSpec {
  Collective what = Collective::kBarrier;  // send/recv: per-stream sequence numbers
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  bool reduces = false;
  uint64_t count = 0;  // elements per rank, for the consistency check
  int root = -1;       // send/recv: the peer (for the flight recorder)
  // The count every rank passes, in the call's signature (transport::Signature: the
  // allgatherv's digest of recv_counts; 0 for alltoallv, whose counts vary).
  uint64_t agreed_count = 0;
  int tag = 0;  // send/recv
  // recv, recv_any: where the body writes the sender (Work::source()).
  std::shared_ptr<std::atomic<int>> source;
};

// What every rank of a call passes alike (transport::Signature), from its spec.
transport::Signature signature_of(const OpSpec& spec);

// An issued operation, as the progress engine queues it and CommunicatorImpl::run()
// runs it.
struct Operation {
  OpSpec spec;
  uint64_t seq;
  OpBody body;
  std::shared_ptr<WorkState> work;
  size_t trace_slot = 0;
  // Begun at issue by the inline path (CommunicatorImpl::issue_inline()), which could
  // not finish it: `body` is what is left, run without beginning the operation again.
  bool begun = false;
};

class CommunicatorImpl final : public Communicator,
                               public Executor,
                               private ProgressEngine<Operation>::Runner,
                               public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, CommOptions options);
  ~CommunicatorImpl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommOptions& options() const override { return options_; }
  const std::string& host_of(int rank) const override;
  const Topology& topology() const override { return topology_; }

  Work allreduce(const void* send, void* recv, size_t count, DataType dtype,
                 ReduceOp op) override;
  Work broadcast(const void* send, void* recv, size_t count, DataType dtype, int root) override;
  Work reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
              int root) override;
  Work allgather(const void* send, void* recv, size_t count, DataType dtype) override;
  Work allgatherv(const void* send, size_t send_count, void* recv,
                  std::span<const size_t> recv_counts, std::span<const size_t> displs,
                  DataType dtype) override;
  Work reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                      ReduceOp op) override;
  Work gather(const void* send, void* recv, size_t count, DataType dtype, int root) override;
  Work scatter(const void* send, void* recv, size_t count, DataType dtype, int root) override;
  Work alltoall(const void* send, void* recv, size_t count, DataType dtype) override;
  Work alltoallv(const void* send, std::span<const size_t> send_counts,
                 std::span<const size_t> send_displs, void* recv,
                 std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                 DataType dtype) override;
  Work barrier() override;
  Work send(const void* buf, size_t count, DataType dtype, int peer, int tag = 0) override;
  Work recv(void* buf, size_t count, DataType dtype, int peer, int tag = 0) override;
  Work recv_any(void* buf, size_t count, DataType dtype, int tag, std::vector<int> sources = {},
                std::shared_ptr<RecvClaim> claim = nullptr) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
  void abort(const std::string& reason) override;
  bool is_aborted() const override { return abort_requested_.load(); }
  using Communicator::algorithm_for;
  Algorithm algorithm_for(Collective collective, size_t bytes) const override;
  void help(const WorkState& work) override;

 private:
  using Op = Operation;

  // Numbers the operation in its stream and queues it in engine_.
  Work enqueue(const OpSpec& spec, OpBody body);
  // A new operation, recorded and counted as unfinished, its Work not yet completed.
  // `started`: it runs from `at` on (the inline path), rather than queued at `at`.
  Op make_op(const OpSpec& spec, uint64_t seq, std::chrono::steady_clock::time_point at, OpBody body,
             bool started = false);
  // The inline path, for small collectives on one node in shared memory: when nothing
  // is queued or running, runs the collective `spec` on the calling thread at once
  // through `attempt`, which may stop short of waiting for the peers (then what is left
  // is queued first and finishes as any queued operation would), and returns its Work.
  // nullopt: the engine was busy and nothing was issued (enqueue() it).
  // `attempt(ctx, rest)` returns true when it finished the operation, or false after
  // setting `rest` to the body that finishes it.
  template <class Attempt>
  std::optional<Work> issue_inline(const OpSpec& spec, Attempt&& attempt);
  // Whether operations may be entered as they are issued here (CHORUS_SHM_INLINE, one
  // node in shared memory, no CHORUS_DEBUG=DETAIL), and whether the inline path may run
  // (that, and no more ranks than cores).
  bool inline_allowed() const;
  bool inline_possible() const;
  // The plan of `call` (plan.cc): the direct path (filling call.in_ref, out_ref) or the
  // algorithm, and whether it starts at issue.
  Plan plan_for(Call& call) const;
  // Validated, planned: issues the call as `spec` (at issue where the plan says so and
  // the engine is idle, queued otherwise).
  Work issue(const OpSpec& spec, Call call);
  // Whether `plan`'s row may start `call` at issue (the tuning table's cut-offs).
  bool starts_at_issue(const Plan& plan, const Call& call) const;
  // Whether this communicator's shape can run `a` for `c` (hierarchical: several
  // uniform nodes; shm: one node in shared memory, reading the peers' buffers where
  // the algorithm does).
  bool runnable(Collective c, Algorithm a) const;
  // The automatic allreduce: the cheapest row by the model (only those over tcp with
  // `tcp_only`), remembered per size.
  Algorithm cheapest_allreduce(size_t bytes, bool tcp_only) const;
  // What every run of an operation starts from: its OpInfo (deadline from `started`),
  // and the context its body runs in.
  transport::OpInfo op_info(const OpSpec& spec, uint64_t seq, std::chrono::steady_clock::time_point started) const;
  algorithms::Context context_for(const OpSpec& spec);
  // Runs `part`, the operation, and completes it, or fails it and aborts the
  // communicator when `part` throws.
  template <class Part>
  void execute(Op& op, Part&& part) {
    try {
      part();
      // abort() while it ran: it fails, whatever it managed to exchange meanwhile (a
      // peer's data may still arrive after the abort, before the wait sees it). The
      // running operation fails with AbortedError, as communicator.h says.
      if (abort_requested_.load(std::memory_order_acquire)) return fail_aborted(op);
      if (recorder_.enabled()) recorder_.finished(op.trace_slot, "");
      unfinished_.fetch_sub(1, std::memory_order_acq_rel);
      op.work->complete(nullptr);
    } catch (...) {
      fail(op, std::current_exception());
    }
  }
  // What execute() does when an operation throws `error`.
  void fail(Op& op, std::exception_ptr error);
  // ProgressEngine::Runner, on the runner role's holder.
  void run(Op& op) override;
  void on_abort() override;
  void fail_aborted(Op& op);
  // abort()'s work; `reason` is the whole cause the operations and the peers see.
  void abort_with(const std::string& reason);
  // The body of recv and recv_any (p2p.cc), on the runner: takes the first message with
  // `mine`'s tag from one of `sources`, held or arriving, into `buf` (`bytes`), holding
  // the messages with other tags it finds on the way; writes the sender to `source`.
  // With a `claim`, returns without a message once another receive has taken it.
  void receive_matching(transport::Transport& t, void* buf, size_t bytes,
                        const std::vector<int>& sources, const transport::Signature& mine,
                        RecvClaim* claim, std::atomic<int>& source);
  // A message that arrived before its receive (receive_matching()), whole.
  struct HeldMessage {
    int peer;
    transport::Signature sig;
    std::vector<uint8_t> bytes;
  };
  void hold(transport::Transport& t, const transport::Arrival& arrival);
  // CHORUS_DEBUG=DETAIL: every rank's fingerprint of `op`, compared before it runs,
  // within `op_info`'s deadline: the check is part of the operation's time.
  void check_consistency(const Op& op, const transport::OpInfo& op_info);
  std::string where() const;
  // Several nodes with the same number of ranks each, more than one per node.
  bool hierarchical_possible() const;
  // Every rank on this node, which shares memory.
  bool all_in_shared_memory() const { return shm_ != nullptr && topology_.nodes == 1; }
  bool direct_path_possible() const override;
  // Whether `call` takes the direct path (include/chorus/shared_memory.h): this
  // communicator is one node in shared memory, the direct path is on
  // (CommOptions::shm_direct), no tcp algorithm is forced, the cost model predicts it no
  // slower than the segment path, and both spans lie in node-shared buffers of this
  // process, which call.in_ref and call.out_ref then say (no input off a broadcast's root).
  bool direct_path(Call& call) const;
  void connect_shared_memory(Store& scoped);
  // The end of creation: a barrier, then this rank's rendezvous keys are deleted.
  void finish_creation(store::KeyLedger& ledger);
  // The creation's own operation (the ring below and the barrier of finish_creation).
  transport::OpInfo creation_op() const;
  // Over tcp, before shared memory routes a node's messages: each rank opens its stream
  // to the next, proving the job token; ranks whose tokens differ fail.
  void prove_token_around_the_ring();

  const int rank_, size_;
  const CommOptions options_;
  std::shared_ptr<Store> user_store_;
  // The ranks of this node in shared memory; null with one rank per node, with
  // CHORUS_TRANSPORT=tcp, or when it could not be set up. Declared before transport_,
  // whose shared-memory part uses it, so that it outlives it.
  std::unique_ptr<transport::shm::ShmGroup> shm_;
  // tcp alone, or (with shm_) routed: this node's ranks through shared memory.
  std::unique_ptr<transport::Transport> transport_;
  std::vector<std::string> hosts_;
  Topology topology_;
  Shape shape_;       // for the cost model
  CostParams cost_;   // CHORUS_COST_MODEL
  // cheapest_allreduce()'s choices, by size: (bytes << 8) | (algorithm +
  // 1) in a slot chosen by hashing bytes, 0 when empty. Any thread may fill a slot.
  static constexpr size_t kChoiceMemo = 16;  // the hash takes the top 4 bits
  mutable std::atomic<uint64_t> allreduce_choice_[kChoiceMemo] = {};
  algorithms::Scratch scratch_;
  // Messages held for their receives, in arrival order, and their payload bytes; only
  // the runner touches them.
  std::deque<HeldMessage> held_;
  size_t held_bytes_ = 0;

  // Operations issued and not yet completed (queued or running): counted up in
  // enqueue() under the engine's lock, down just before each Work completes, so that a
  // destructor called once every Work is waited for sees 0.
  std::atomic<size_t> unfinished_{0};
  // Threads inside enqueue() now (CHORUS_DEBUG=DETAIL only).
  std::atomic<int> issuing_{0};

  std::atomic<bool> abort_requested_{false};
  std::mutex abort_mutex_;  // guards abort_reason_
  std::string abort_reason_;
  std::atomic<bool> transport_aborted_{false};  // written by the runner only

  FlightRecorder recorder_;
  std::atomic<bool> trace_written_{false};
  // Writes the flight recorder once, on the first failure or abort, or when the
  // process gets SIGTERM (stop_traces.h) after this communicator issued an operation.
  void write_trace(const std::string& why);
  uint64_t stop_trace_id_ = 0;  // add_stop_trace()'s, 0 without a flight recorder

  uint64_t split_count_ = 0;
  // The queue and the runner role: only the role's holder (the progress thread or a
  // thread inside Work::wait()) touches transport_ and shm_ (abort_with() only
  // interrupts them), scratch_ and transport_aborted_. Last, so that its thread is gone
  // before any member it uses.
  ProgressEngine<Op> engine_{*this, abort_requested_};
};

}  // namespace chorus::communicator
