#include "chorus/torch/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "chorus/error.h"

namespace chorus::torch_ext {

struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;    // indices into Impl::params
  std::vector<int64_t> offsets;  // element offset of each parameter in `buffer`
  at::Tensor buffer;             // the flat gradients
  at::Tensor wire;               // the compressed copy that travels, when compressing
  size_t pending = 0;            // gradients still missing in this backward
  Work work;
};

struct DistributedDataParallel::Impl {
  std::vector<at::Tensor> params;  // parameters that require grad, registration order
  std::vector<std::string> names;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<Bucket> buckets;
  std::vector<bool> ready;
  size_t next_bucket = 0;
  bool in_backward = false;
  // The accumulators must outlive the hooks: a variable holds its accumulator weakly.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;
  std::vector<at::Tensor> buffers;
  // A group of one rank without compression: gradients stay where autograd put them
  // (no bucket copies, no collectives); the unused-parameter check still runs.
  bool solo = false;
};

// Runs after a parameter's gradient has been accumulated into .grad.
class GradHook : public torch::autograd::FunctionPostHook {
 public:
  GradHook(DistributedDataParallel* ddp, size_t param) : ddp_(ddp), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ddp_->on_grad_ready(param_);
    return outputs;
  }

 private:
  DistributedDataParallel* ddp_;
  size_t param_;
};

namespace {

void broadcast_all(ProcessGroup& group, const std::vector<at::Tensor>& tensors) {
  std::vector<Work> works;
  for (const at::Tensor& t : tensors) works.push_back(group.broadcast(t, 0));
  for (Work& w : works) w.wait();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options),
      impl_(std::make_unique<Impl>()) {
  if (!module_ || !group_) throw InvalidArgumentError("DistributedDataParallel: null module or group");
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    impl_->params.push_back(item.value());
    impl_->names.push_back(item.key());
  }
  for (auto& b : module_->buffers(/*recurse=*/true)) impl_->buffers.push_back(b);
  {
    torch::NoGradGuard no_grad;
    broadcast_all(*group_, impl_->params);
    broadcast_all(*group_, impl_->buffers);
  }
  // Buckets in reverse registration order, split by size cap and dtype.
  const size_t n = impl_->params.size();
  impl_->bucket_of.assign(n, 0);
  impl_->slot_of.assign(n, 0);
  double cap = options_.first_bucket_mb * 1024 * 1024;
  double filled = 0;
  for (size_t k = n; k-- > 0;) {
    const at::Tensor& p = impl_->params[k];
    double bytes = static_cast<double>(p.numel() * p.element_size());
    bool new_bucket = impl_->buckets.empty() || filled >= cap ||
                      impl_->params[impl_->buckets.back().params.front()].scalar_type() !=
                          p.scalar_type();
    if (new_bucket) {
      if (!impl_->buckets.empty()) cap = options_.bucket_cap_mb * 1024 * 1024;
      impl_->buckets.emplace_back();
      filled = 0;
    }
    Bucket& b = impl_->buckets.back();
    impl_->bucket_of[k] = impl_->buckets.size() - 1;
    impl_->slot_of[k] = b.params.size();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + impl_->params[b.params.back()].numel());
    b.params.push_back(k);
    filled += bytes;
  }
  for (Bucket& b : impl_->buckets) {
    const at::Tensor& last = impl_->params[b.params.back()];
    b.buffer = at::zeros({b.offsets.back() + last.numel()}, last.options().requires_grad(false));
  }
  impl_->ready.assign(n, false);
  impl_->solo = group_->size() == 1 && options_.compression == Compression::kNone;
  for (size_t k = 0; k < n; ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(impl_->params[k]);
    impl_->hook_keys.push_back(acc->add_post_hook(std::make_unique<GradHook>(this, k)));
    impl_->accumulators.push_back(std::move(acc));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < impl_->accumulators.size(); ++k) {
    impl_->accumulators[k]->del_post_hook(impl_->hook_keys[k]);
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.params);
  return out;
}

void DistributedDataParallel::prepare_forward() {
  if (options_.broadcast_buffers && !impl_->buffers.empty()) {
    torch::NoGradGuard no_grad;
    broadcast_all(*group_, impl_->buffers);
  }
}

void DistributedDataParallel::start_backward() {
  impl_->in_backward = true;
  impl_->next_bucket = 0;
  std::fill(impl_->ready.begin(), impl_->ready.end(), false);
  for (Bucket& b : impl_->buckets) b.pending = b.params.size();
  // Runs when the autograd engine has finished this backward pass, before backward()
  // returns to the caller.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  if (!sync_) return;
  if (!impl_->in_backward) start_backward();
  if (impl_->ready[k]) return;
  impl_->ready[k] = true;
  if (impl_->solo) return;  // one rank: the average is the gradient itself
  Bucket& b = impl_->buckets[impl_->bucket_of[k]];
  const at::Tensor& p = impl_->params[k];
  at::Tensor slot = b.buffer.narrow(0, b.offsets[impl_->slot_of[k]], p.numel());
  const at::Tensor& grad = p.grad();
  if (!grad.defined()) slot.zero_();
  else if (grad.data_ptr() != slot.data_ptr()) slot.copy_(grad.reshape(-1));  // not in the bucket yet
  if (--b.pending == 0) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // Strictly in bucket order: every rank must issue the same allreduces in the same
  // order, whatever order its gradients arrived in.
  while (impl_->next_bucket < impl_->buckets.size() &&
         impl_->buckets[impl_->next_bucket].pending == 0) {
    Bucket& b = impl_->buckets[impl_->next_bucket++];
    if (options_.compression == Compression::kNone) {
      b.work = group_->allreduce(b.buffer, ReduceOp::kAvg);
    } else {
      b.wire = b.buffer.to(options_.compression == Compression::kFloat16 ? at::kHalf : at::kBFloat16);
      b.work = group_->allreduce(b.wire, ReduceOp::kAvg);
    }
  }
}

void DistributedDataParallel::finish_backward() {
  impl_->in_backward = false;
  std::string unused;
  for (size_t k = 0; k < impl_->params.size(); ++k) {
    if (impl_->ready[k]) continue;
    if (!options_.find_unused_parameters) {
      unused += (unused.empty() ? "" : ", ") + impl_->names[k];
      continue;
    }
    impl_->ready[k] = true;
    if (impl_->solo) {  // as with more ranks: an unused parameter's gradient is zero
      torch::NoGradGuard no_grad;
      at::Tensor& p = impl_->params[k];
      if (p.grad().defined()) p.mutable_grad().zero_();
      else p.mutable_grad() = at::zeros_like(p);
      continue;
    }
    Bucket& b = impl_->buckets[impl_->bucket_of[k]];
    b.buffer.narrow(0, b.offsets[impl_->slot_of[k]], impl_->params[k].numel()).zero_();
    --b.pending;
  }
  if (!unused.empty()) {
    // The other ranks wait in this backward's allreduces: abort so they fail too.
    group_->communicator().abort("rank " + std::to_string(group_->rank()) +
                                 ": parameters without a gradient: " + unused);
    throw InvalidArgumentError(
        "DistributedDataParallel on rank " + std::to_string(group_->rank()) +
        ": these parameters got no gradient in this backward pass: " + unused +
        " (construct with find_unused_parameters = true if that is intended)");
  }
  if (impl_->solo) return;
  launch_ready_buckets();
  torch::NoGradGuard no_grad;
  for (Bucket& b : impl_->buckets) {
    b.work.wait();
    if (options_.compression != Compression::kNone) b.buffer.copy_(b.wire);
    for (size_t s = 0; s < b.params.size(); ++s) {
      at::Tensor& p = impl_->params[b.params[s]];
      at::Tensor view = b.buffer.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      if (options_.gradient_as_bucket_view) {
        if (!p.grad().defined() || p.grad().data_ptr() != view.data_ptr()) {
          // Shares the bucket's storage without being an autograd view, so that
          // Optimizer::zero_grad() (detach_ and zero_) works on it; the next backward
          // then accumulates straight into the bucket, and no copy is made either way.
          at::Tensor alias = at::empty({0}, view.options());
          alias.set_(b.buffer.storage(), view.storage_offset(), view.sizes(), view.strides());
          p.mutable_grad() = alias;
        }
      } else if (p.grad().defined()) {
        p.mutable_grad().copy_(view);
      } else {
        p.mutable_grad() = view.clone();
      }
    }
  }
}

}  // namespace chorus::torch_ext
