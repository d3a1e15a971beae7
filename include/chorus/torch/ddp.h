// DistributedDataParallel for libtorch's C++ frontend.
//
// Construction broadcasts the module's parameters and buffers from rank 0, so every
// replica starts equal. Then each backward() averages the gradients over the ranks
// before it returns: a post-hook on each parameter's gradient accumulator copies the
// gradient into its bucket; a bucket's allreduce starts as soon as all its gradients
// are in (buckets are launched in a fixed order, the same on every rank), overlapping
// the rest of the backward pass; a callback queued on the autograd engine waits for
// every bucket and writes the averages back into .grad before backward() returns. The
// optimizer step therefore needs no extra call, as in PyTorch.
//
// Buckets hold parameters in reverse registration order (gradients become ready
// roughly in that order): the first up to first_bucket_mb, the others up to
// bucket_cap_mb, never mixing dtypes. Where the group's collectives on node-shared
// buffers can take the direct path (Communicator::direct_path_possible(): more than one
// rank, all on one node in shared memory, CHORUS_SHM_DIRECT not 0), the buckets are
// node-shared memory (chorus/shared_memory.h), so their allreduce reads and writes the
// peers' buckets directly instead of copying them through the node's segment; the sums
// are the same bytes either way. Every rank decides the same, as the direct path needs.
//
// What travels is up to a communication hook (register_comm_hook): by default each
// bucket is allreduced and averaged; DdpOptions::compression and the hooks below are
// other choices, and any callable over a GradBucket can be one.
//
// Uneven inputs: ranks with fewer batches than others call join() inside an
// UnevenInputs guard, and shadow the collectives of the ranks still training until all
// have run out (see UnevenInputs).
//
// Timing: last_step_stats() says how long the latest synchronized backward waited for
// its buckets' communication (what the overlap with the backward pass did not hide).
//
// Threading: one thread trains a replica (calls forward and backward). Errors during
// the allreduce (a dead peer, a timeout) are rethrown from backward().
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chorus/torch/process_group.h"

namespace chorus::torch_ext {

enum class Compression { kNone, kFloat16, kBFloat16 };

// One bucket, as a communication hook sees it.
struct GradBucket {
  size_t index = 0;      // launch order: 0 is the first bucket allreduced
  bool is_last = false;  // the last bucket of the backward pass
  // This rank's gradients of the bucket's parameters, flat and contiguous, one after
  // the other (a joined rank's are zeros: see UnevenInputs). The hook may change it.
  at::Tensor buffer;
  // The bucket's parameters (indices in registration order, as bucket_layout() gives
  // them), and where each one's gradient starts in `buffer`, in elements.
  std::span<const size_t> parameter_indices;
  std::span<const at::Tensor> parameters;
  std::span<const int64_t> offsets;
  // What an average divides the sum by: the group size, or under UnevenInputs with
  // divide_by_initial_world_size = false, the number of ranks still training this step.
  int divisor = 1;
  ProcessGroup* group = nullptr;
};

// What a communication hook returns: the Work it started, and the tensor that holds
// the bucket's new gradients once that Work has completed. then() adds a step run after
// the Work completes (on the training thread, inside backward()), which maps the result
// to the next one: to divide a sum, cast back, or run a second collective and wait for
// it.
class CommFuture {
 public:
  // Completed at once with `result` (a hook that does not communicate).
  explicit CommFuture(at::Tensor result) : result_(std::move(result)) {}
  CommFuture(Work work, at::Tensor result) : work_(std::move(work)), result_(std::move(result)) {}

  CommFuture then(std::function<at::Tensor(at::Tensor)> step) const;

  // Waits for the Work (throwing its error), runs the steps in order and returns the
  // last result. Call once.
  at::Tensor wait();

  const Work& work() const { return work_; }

 private:
  Work work_;
  at::Tensor result_;
  std::vector<std::function<at::Tensor(at::Tensor)>> steps_;
};

// A communication hook: starts the communication of one bucket and returns its future.
// The future's result becomes the bucket's gradients: a tensor with as many elements as
// the bucket (any shape, any floating dtype: it is copied into the bucket, converting),
// or the bucket's buffer itself, updated in place. Every rank must register the same
// hook, and a hook must issue the same collectives in the same order on every rank
// (buckets are launched in the same order everywhere); state it needs is captured in
// the callable (torch passes it as a separate argument). A hook that throws, a Work
// or then() step that fails, or a result of the wrong size fails backward() on this
// rank with a message that starts with the rank, the bucket and its parameters (a
// chorus::Error keeps its kind, anything else becomes an InvalidArgumentError), and
// aborts the communicator so that the other ranks fail too instead of waiting: their
// errors carry this rank's reason.
using CommHook = std::function<CommFuture(GradBucket&)>;

// Ready-made hooks.
// The default: allreduce the bucket and divide by bucket.divisor, in place.
CommFuture allreduce_hook(GradBucket& bucket);
// Allreduce a float16 / bfloat16 copy (half the bytes), averaged in that type, then
// copied back into the bucket: DdpOptions::compression's kFloat16 / kBFloat16.
CommFuture fp16_compress_hook(GradBucket& bucket);
CommFuture bf16_compress_hook(GradBucket& bucket);

// UnevenInputs' options.
struct JoinOptions {
  // true: averages divide by the group size however many ranks still train (joined
  // ranks count as zero gradients), as torch's default. false: by the number of ranks
  // still training that step.
  bool divide_by_initial_world_size = true;
};

struct DdpOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  // Broadcast buffers (e.g. batch-norm statistics) from rank 0 before every forward.
  bool broadcast_buffers = true;
  // Parameters that get no gradient in a backward are treated as zero gradients.
  // When false, such a parameter is an error that names it.
  bool find_unused_parameters = false;
  // After a synchronized backward, each .grad is a view into its bucket (no copy back).
  bool gradient_as_bucket_view = false;
  // Communication hook: cast buckets to fp16/bf16 for the allreduce (half the bytes).
  // The same as registering fp16_compress_hook / bf16_compress_hook.
  Compression compression = Compression::kNone;
};

// What the latest synchronized backward pass cost this rank (last_step_stats()). The
// wait is the communication that overlapping it with the backward pass did not hide;
// the rest of a step (forward, backward, optimizer) minus the wait is compute. Times
// are seconds of std::chrono::steady_clock, on the training thread.
struct DdpStats {
  // Synchronized backward passes so far; 0: none yet (and the fields below are zero).
  // Backward passes under no_sync, and a joined rank's shadowed ones, do not count.
  uint64_t steps = 0;
  // Buckets whose communication this backward waited for: 0 on a group of one rank
  // with the default hook, which communicates nothing.
  size_t buckets = 0;
  // From when the backward's first gradient was ready (autograd work before that is
  // not seen by DDP) until backward() returns the averaged gradients.
  double backward_seconds = 0;
  // Of backward_seconds: the time the callback at the end of the backward pass spent
  // waiting for the buckets' futures (CommFuture::wait, the hooks' then() steps
  // included), after autograd had computed every gradient.
  double wait_seconds = 0;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call before each forward pass (forward() does it for modules with a forward
  // method): broadcasts buffers when asked.
  void prepare_forward();

  template <class M, class... Args>
  auto forward(M& module, Args&&... args) {
    prepare_forward();
    return module->forward(std::forward<Args>(args)...);
  }

  // While the returned guard lives, backward passes accumulate gradients locally
  // without communication (gradient accumulation); the next synchronized backward
  // averages the accumulated sums.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), was_(ddp.sync_) { ddp.sync_ = false; }
    ~NoSync() { ddp_.sync_ = was_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool was_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Replaces the default communication hook (allreduce_hook) with `hook` (see
  // CommHook). Call once, on every rank, before the first backward pass; a second call,
  // a call after a backward or with DdpOptions::compression set throws
  // InvalidArgumentError.
  void register_comm_hook(CommHook hook);

  // Uneven inputs, as torch's Join. Every rank creates the guard at the same point (it
  // sends nothing), trains on however many batches it has, then calls join():
  //
  //   {
  //     auto uneven = ddp.uneven_inputs();
  //     for (auto& batch : my_batches) { /* forward, backward, step */ }
  //     ddp.join();
  //   }
  //
  // Protocol: while the guard lives, each forward first allreduces one small state per
  // rank (training and synchronizing, training under no_sync or without gradients, or
  // joined), so every rank learns what the step will do. join() answers those rounds for
  // a rank that is out of batches: each step it takes part in the buffer broadcast
  // (broadcast_buffers) and, when the step synchronizes, runs the hook on zero buckets,
  // in the same order as the training ranks, so their sums see zeros from it. The first
  // round in which no rank trains ends join() on every rank; then, when some rank had
  // joined early, the parameters and buffers of the lowest rank that trained to the end
  // are broadcast to all, so the replicas end bitwise equal (a joined rank's optimizer
  // state, momentum for one, stays as it was when it joined).
  //
  // Contracts: buffers are broadcast from the lowest rank still training, not rank 0.
  // Whether a backward synchronizes is fixed at its forward: no_sync must cover the
  // forward (as in torch), and the training ranks of a step must agree on it (every
  // rank throws InvalidArgumentError otherwise). Every forward with gradients enabled
  // must be followed by its backward, and a rank that has joined makes no more forward
  // passes in the guard (InvalidArgumentError). Every wait has the communicator's
  // deadline: a rank that never calls join() fails the others with a timeout.
  class UnevenInputs {
   public:
    UnevenInputs(DistributedDataParallel& ddp, JoinOptions options);
    ~UnevenInputs();
    UnevenInputs(const UnevenInputs&) = delete;
    UnevenInputs& operator=(const UnevenInputs&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  UnevenInputs uneven_inputs(JoinOptions options = {}) { return UnevenInputs(*this, options); }
  // Inside UnevenInputs, once this rank has no more batches: see above. Throws
  // InvalidArgumentError outside the guard or when called twice in it.
  void join();

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  ProcessGroup& group() { return *group_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // The latest synchronized backward's timing (see DdpStats); read it after backward()
  // returns, on the training thread. A backward that threw leaves the previous one's.
  DdpStats last_step_stats() const;
  // Whether the buckets are node-shared memory (see the top of this file).
  bool buckets_in_shared_memory() const;

 private:
  struct Bucket;
  struct Impl;
  friend class GradHook;
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void finish_backward();
  void start_backward();
  // Communication hooks: each bucket's hook, its wait, and the first failure.
  std::optional<CommFuture> run_hook(size_t index, const at::Tensor& buffer);
  at::Tensor wait_bucket(size_t index, std::optional<CommFuture>& future);
  void fail_bucket(size_t index, const std::string& what, std::exception_ptr error);
  std::string bucket_context(size_t index) const;
  void rethrow_failure();
  // Uneven inputs.
  int exchange_join_state(bool joined);
  void shadow_backward();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  bool sync_ = true;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::torch_ext
