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
// bucket_cap_mb, never mixing dtypes.
//
// Threading: one thread trains a replica (calls forward and backward). Errors during
// the allreduce (a dead peer, a timeout) are rethrown from backward().
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "chorus/torch/process_group.h"

namespace chorus::torch_ext {

enum class Compression { kNone, kFloat16, kBFloat16 };

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
  Compression compression = Compression::kNone;
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

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  ProcessGroup& group() { return *group_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;

 private:
  struct Bucket;
  struct Impl;
  friend class GradHook;
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void finish_backward();
  void start_backward();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  bool sync_ = true;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::torch_ext
