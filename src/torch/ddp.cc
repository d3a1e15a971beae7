#include "chorus/torch/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <optional>

#include "chorus/error.h"
#include "chorus/shared_memory.h"

namespace chorus::torch_ext {

struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;       // indices into Impl::params
  std::vector<at::Tensor> tensors;  // those parameters, for GradBucket
  std::vector<int64_t> offsets;     // element offset of each parameter in `buffer`
  at::Tensor buffer;                // the flat gradients
  size_t pending = 0;               // gradients still missing in this backward
  std::optional<CommFuture> future;  // this backward's communication, once launched
};

struct DistributedDataParallel::Impl {
  std::vector<at::Tensor> params;  // parameters that require grad, registration order
  std::vector<std::string> names;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<Bucket> buckets;
  std::vector<bool> ready;
  size_t next_bucket = 0;
  bool in_backward = false;
  bool started = false;  // a backward (synchronized or not) has run
  // The accumulators must outlive the hooks: a variable holds its accumulator weakly.
  // (a shared_ptr in torch 1.x, an intrusive_ptr since torch 2.x: whatever it returns)
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()))>
      accumulators;
  std::vector<uintptr_t> hook_keys;
  std::vector<at::Tensor> buffers;
  // The buckets are node-shared memory (see ddp.h); a joined rank's zero buckets too.
  bool shared_buckets = false;
  std::vector<at::Tensor> zero_buckets;  // shadow_backward's, made at its first use
  // A group of one rank with the default hook: gradients stay where autograd put them
  // (no bucket copies, no collectives); the unused-parameter check still runs.
  bool solo = false;
  CommHook hook = allreduce_hook;
  bool hook_registered = false;
  // The first failure of this backward (or shadowed backward) and its bucket; the
  // communicator is aborted when it is recorded.
  std::exception_ptr failure;
  std::string failure_context;
  // What the hooks divide averages by this step, and the rank buffers come from.
  int divisor = 1;
  int buffer_root = 0;
  // Uneven inputs (while an UnevenInputs guard lives).
  bool uneven = false;
  JoinOptions join_options;
  bool joined = false;
  bool step_sync = true;     // whether this step's backward synchronizes
  bool some_joined = false;  // a step of this guard trained without every rank
  int last_root = -1;        // the lowest rank of the latest step's training ranks
  // Timing (last_step_stats): when this backward's first gradient was ready.
  std::chrono::steady_clock::time_point backward_start;
  DdpStats stats;
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

void broadcast_all(ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root) {
  std::vector<Work> works;
  for (const at::Tensor& t : tensors) works.push_back(group.broadcast(t, root));
  for (Work& w : works) w.wait();
}

// Throws `error` again with `context` in front of its message, keeping its kind (a
// chorus::Error of another kind stays that kind; anything else, thrown by a hook, is
// an InvalidArgumentError).
[[noreturn]] void throw_with_context(const std::exception_ptr& error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what(), e.awaited_ranks());
  } catch (const Error& e) {
    const std::string m = context + e.what();
    switch (e.kind()) {
      case ErrorKind::kInvalidArgument: throw InvalidArgumentError(m);
      case ErrorKind::kConfig: throw ConfigError(m);
      case ErrorKind::kTimeout: throw TimeoutError(m);
      case ErrorKind::kPeer: throw PeerError(m);
      case ErrorKind::kAborted: throw AbortedError(m);
      case ErrorKind::kStore: throw StoreError(m);
      case ErrorKind::kSystem: throw SystemError(m);
    }
    throw Error(e.kind(), m);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(context + e.what());
  } catch (...) {
    throw InvalidArgumentError(context + "an exception that is not a std::exception");
  }
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// A zero-filled flat tensor of `numel` elements for a bucket: in node-shared memory
// when `shared` (the tensor keeps the buffer alive), ordinary memory otherwise.
at::Tensor new_bucket(int64_t numel, const at::TensorOptions& options, bool shared) {
  if (!shared || numel == 0) return at::zeros({numel}, options);
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  std::shared_ptr<SharedBuffer> memory = allocate_shared(bytes);  // zero-filled
  void* data = memory->data();
  return at::from_blob(data, {numel}, [memory](void*) mutable { memory.reset(); }, options);
}

CommFuture average(GradBucket& bucket, const at::Tensor& wire) {
  ProcessGroup& group = *bucket.group;
  if (bucket.divisor == group.size()) return CommFuture(group.allreduce(wire, ReduceOp::kAvg), wire);
  // Fewer ranks than the group to average over (uneven inputs): sum, then divide in
  // the bucket's type.
  const int divisor = bucket.divisor;
  const at::ScalarType type = bucket.buffer.scalar_type();
  return CommFuture(group.allreduce(wire, ReduceOp::kSum), wire).then([divisor, type](at::Tensor t) {
    t = t.to(type);
    return divisor == 1 ? t : t.div_(divisor);
  });
}

}  // namespace

CommFuture CommFuture::then(std::function<at::Tensor(at::Tensor)> step) const {
  CommFuture next = *this;
  next.steps_.push_back(std::move(step));
  return next;
}

at::Tensor CommFuture::wait() {
  work_.wait();
  for (auto& step : steps_) result_ = step(std::move(result_));
  steps_.clear();
  return result_;
}

CommFuture allreduce_hook(GradBucket& bucket) { return average(bucket, bucket.buffer); }
CommFuture fp16_compress_hook(GradBucket& bucket) { return average(bucket, bucket.buffer.to(at::kHalf)); }
CommFuture bf16_compress_hook(GradBucket& bucket) { return average(bucket, bucket.buffer.to(at::kBFloat16)); }

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
    broadcast_all(*group_, impl_->params, 0);
    broadcast_all(*group_, impl_->buffers, 0);
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
    b.tensors.push_back(p);
    filled += bytes;
  }
  // Every rank decides the same (the communicator's shape and options), as it must: the
  // ranks of a node that pass node-shared buffers and those that do not fail the
  // allreduce. With one rank the buckets are not communicated at all.
  impl_->shared_buckets = group_->size() > 1 && group_->communicator().direct_path_possible();
  for (Bucket& b : impl_->buckets) {
    const at::Tensor& last = impl_->params[b.params.back()];
    b.buffer = new_bucket(b.offsets.back() + last.numel(), last.options().requires_grad(false),
                          impl_->shared_buckets);
  }
  impl_->ready.assign(n, false);
  impl_->divisor = group_->size();
  switch (options_.compression) {
    case Compression::kNone: break;
    case Compression::kFloat16: impl_->hook = fp16_compress_hook; break;
    case Compression::kBFloat16: impl_->hook = bf16_compress_hook; break;
  }
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

DdpStats DistributedDataParallel::last_step_stats() const { return impl_->stats; }

bool DistributedDataParallel::buckets_in_shared_memory() const { return impl_->shared_buckets; }

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  const std::string who =
      "DistributedDataParallel::register_comm_hook on rank " + std::to_string(group_->rank()) + ": ";
  if (!hook) throw InvalidArgumentError(who + "the hook is empty");
  if (options_.compression != Compression::kNone) {
    throw InvalidArgumentError(who + "DdpOptions::compression already installs a hook "
                               "(fp16_compress_hook or bf16_compress_hook); use one or the other");
  }
  if (impl_->hook_registered) {
    throw InvalidArgumentError(who + "a communication hook is already registered (register once)");
  }
  if (impl_->started) {
    throw InvalidArgumentError(who + "must be called before the first backward pass "
                               "(every step of a run must average the same way)");
  }
  impl_->hook = std::move(hook);
  impl_->hook_registered = true;
  impl_->solo = false;  // a hook runs even on one rank: it may do more than average
}

void DistributedDataParallel::prepare_forward() {
  if (impl_->uneven) {
    if (impl_->joined) {
      throw InvalidArgumentError("DistributedDataParallel on rank " + std::to_string(group_->rank()) +
                                 ": forward after join() in the same uneven_inputs guard (a joined "
                                 "rank has no more batches in it)");
    }
    exchange_join_state(false);
  }
  if (options_.broadcast_buffers && !impl_->buffers.empty()) {
    torch::NoGradGuard no_grad;
    broadcast_all(*group_, impl_->buffers, impl_->buffer_root);
  }
}

// One round of the uneven-inputs protocol: every rank adds its state at its index (0
// joined, 1 training without synchronizing, 2 training and synchronizing), so every
// rank learns how many still train (returned), whether the step synchronizes and who
// leads it.
int DistributedDataParallel::exchange_join_state(bool joined) {
  const int size = group_->size();
  const int mine = joined ? 0 : (sync_ && torch::GradMode::is_enabled() ? 2 : 1);
  at::Tensor states = at::zeros({size}, at::kInt);
  states.data_ptr<int32_t>()[group_->rank()] = mine;
  group_->allreduce(states, ReduceOp::kSum).wait();
  const int32_t* s = states.data_ptr<int32_t>();
  int training = 0, lowest = -1;
  std::string syncing, not_syncing;
  for (int r = 0; r < size; ++r) {
    if (s[r] == 0) continue;
    ++training;
    if (lowest < 0) lowest = r;
    std::string& list = s[r] == 2 ? syncing : not_syncing;
    list += (list.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!syncing.empty() && !not_syncing.empty()) {
    throw InvalidArgumentError(
        "DistributedDataParallel on rank " + std::to_string(group_->rank()) +
        ", uneven inputs: the ranks still training disagree on no_sync in this step (ranks " +
        syncing + " synchronize, ranks " + not_syncing +
        " are under no_sync or without gradients); they must agree, since the joined ranks "
        "follow them");
  }
  impl_->step_sync = !syncing.empty();
  if (training == 0) return 0;  // everyone has joined
  impl_->divisor = impl_->join_options.divide_by_initial_world_size ? size : training;
  impl_->buffer_root = lowest;
  impl_->last_root = lowest;
  if (training < size) impl_->some_joined = true;
  return training;
}

void DistributedDataParallel::start_backward() {
  impl_->backward_start = std::chrono::steady_clock::now();
  impl_->in_backward = true;
  impl_->next_bucket = 0;
  impl_->failure = nullptr;
  std::fill(impl_->ready.begin(), impl_->ready.end(), false);
  for (Bucket& b : impl_->buckets) {
    b.pending = b.params.size();
    b.future.reset();
  }
  // Runs when the autograd engine has finished this backward pass, before backward()
  // returns to the caller.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  impl_->started = true;
  // Inside UnevenInputs the forward decided (and told the joined ranks) whether this
  // backward synchronizes.
  if (!(impl_->uneven ? impl_->step_sync : sync_)) return;
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

std::string DistributedDataParallel::bucket_context(size_t index) const {
  const Bucket& b = impl_->buckets[index];
  std::string names;
  const size_t shown = std::min<size_t>(b.params.size(), 3);
  for (size_t s = 0; s < shown; ++s) names += (s ? ", " : "") + impl_->names[b.params[s]];
  if (b.params.size() > shown) names += " and " + std::to_string(b.params.size() - shown) + " more";
  return "DistributedDataParallel on rank " + std::to_string(group_->rank()) +
         (impl_->joined ? " (joined, shadowing the training ranks)" : "") + ": bucket " +
         std::to_string(index) + " of " + std::to_string(impl_->buckets.size()) + " (" + names + "): ";
}

void DistributedDataParallel::fail_bucket(size_t index, const std::string& what,
                                          std::exception_ptr error) {
  if (impl_->failure) return;  // the first failure is the cause; later ones follow from it
  impl_->failure = error;
  impl_->failure_context = bucket_context(index) + what;
  // The other ranks wait for this rank's part of the bucket (or will, at their next
  // collective): abort so that they fail too, naming this bucket.
  group_->communicator().abort(impl_->failure_context + message_of(error));
}

std::optional<CommFuture> DistributedDataParallel::run_hook(size_t index, const at::Tensor& buffer) {
  if (impl_->failure) return std::nullopt;  // the communicator is aborted already
  Bucket& b = impl_->buckets[index];
  GradBucket view;
  view.index = index;
  view.is_last = index + 1 == impl_->buckets.size();
  view.buffer = buffer;
  view.parameter_indices = b.params;
  view.parameters = b.tensors;
  view.offsets = b.offsets;
  view.divisor = impl_->divisor;
  view.group = group_.get();
  try {
    return impl_->hook(view);
  } catch (...) {
    fail_bucket(index, "the communication hook threw: ", std::current_exception());
    return std::nullopt;
  }
}

at::Tensor DistributedDataParallel::wait_bucket(size_t index, std::optional<CommFuture>& future) {
  if (!future) return {};
  try {
    at::Tensor result = future->wait();
    future.reset();
    const int64_t want = impl_->buckets[index].buffer.numel();
    if (!result.defined() || result.numel() != want) {
      throw InvalidArgumentError("the hook's result has " +
                                 (result.defined() ? std::to_string(result.numel()) : std::string("no")) +
                                 " elements, the bucket " + std::to_string(want));
    }
    return result;
  } catch (...) {
    future.reset();
    fail_bucket(index, "", std::current_exception());
    return {};
  }
}

void DistributedDataParallel::rethrow_failure() {
  if (!impl_->failure) return;
  std::exception_ptr error = impl_->failure;
  impl_->failure = nullptr;
  throw_with_context(error, impl_->failure_context);
}

void DistributedDataParallel::launch_ready_buckets() {
  // Strictly in bucket order: every rank must issue the same allreduces in the same
  // order, whatever order its gradients arrived in.
  while (impl_->next_bucket < impl_->buckets.size() &&
         impl_->buckets[impl_->next_bucket].pending == 0) {
    const size_t index = impl_->next_bucket++;
    Bucket& b = impl_->buckets[index];
    b.future = run_hook(index, b.buffer);
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
  if (impl_->solo) {
    impl_->stats = {impl_->stats.steps + 1, 0, seconds_since(impl_->backward_start), 0};
    return;
  }
  launch_ready_buckets();
  torch::NoGradGuard no_grad;
  double waited = 0;
  // After a failure the remaining buckets are still waited for (they fail at once on the
  // aborted communicator), so that none is in flight when backward() throws.
  for (size_t index = 0; index < impl_->buckets.size(); ++index) {
    Bucket& b = impl_->buckets[index];
    const auto wait_start = std::chrono::steady_clock::now();
    at::Tensor result = wait_bucket(index, b.future);
    waited += seconds_since(wait_start);
    if (impl_->failure) continue;
    if (result.data_ptr() != b.buffer.data_ptr()) b.buffer.copy_(result.reshape(-1));
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
  rethrow_failure();
  impl_->stats = {impl_->stats.steps + 1, impl_->buckets.size(), seconds_since(impl_->backward_start),
                  waited};
}

DistributedDataParallel::UnevenInputs::UnevenInputs(DistributedDataParallel& ddp, JoinOptions options)
    : ddp_(ddp) {
  Impl& impl = *ddp.impl_;
  if (impl.uneven) {
    throw InvalidArgumentError("DistributedDataParallel::uneven_inputs on rank " +
                               std::to_string(ddp.group_->rank()) + ": a guard is already active");
  }
  impl.uneven = true;
  impl.join_options = options;
  impl.joined = false;
  impl.some_joined = false;
  impl.last_root = -1;
}

DistributedDataParallel::UnevenInputs::~UnevenInputs() {
  Impl& impl = *ddp_.impl_;
  impl.uneven = false;
  impl.joined = false;
  impl.step_sync = true;
  impl.divisor = ddp_.group_->size();
  impl.buffer_root = 0;
}

void DistributedDataParallel::join() {
  const std::string who = "DistributedDataParallel::join on rank " + std::to_string(group_->rank()) + ": ";
  if (!impl_->uneven) {
    throw InvalidArgumentError(who + "outside an uneven_inputs() guard (create one on every rank "
                               "around the training loop)");
  }
  if (impl_->joined) throw InvalidArgumentError(who + "this rank has already joined in this guard");
  impl_->joined = true;
  impl_->started = true;
  torch::NoGradGuard no_grad;
  // One round per step of the ranks still training, until a round where none is.
  while (exchange_join_state(true) > 0) {
    if (options_.broadcast_buffers && !impl_->buffers.empty()) {
      broadcast_all(*group_, impl_->buffers, impl_->buffer_root);
    }
    if (impl_->step_sync) shadow_backward();
  }
  // Joined ranks skipped optimizer steps: take the replica of a rank that trained to
  // the end. (Every rank saw the same rounds, so all agree on whether and from whom.)
  if (impl_->some_joined) {
    broadcast_all(*group_, impl_->params, impl_->last_root);
    broadcast_all(*group_, impl_->buffers, impl_->last_root);
  }
}

// The collectives of a synchronized backward, on zero buckets: the hook of every bucket
// in launch order, then the waits in the same order, as finish_backward does.
void DistributedDataParallel::shadow_backward() {
  impl_->failure = nullptr;
  // Zeros of the same kind of memory as the training ranks' buckets, which the direct
  // path requires; kept from step to step and zeroed again (a hook may write into them).
  std::vector<at::Tensor>& zeros = impl_->zero_buckets;
  if (zeros.empty()) {
    for (const Bucket& b : impl_->buckets) {
      zeros.push_back(new_bucket(b.buffer.numel(), b.buffer.options(), impl_->shared_buckets));
    }
  }
  std::vector<std::optional<CommFuture>> futures(impl_->buckets.size());
  for (size_t index = 0; index < futures.size(); ++index) {
    futures[index] = run_hook(index, zeros[index].zero_());
  }
  for (size_t index = 0; index < futures.size(); ++index) wait_bucket(index, futures[index]);
  rethrow_failure();
}

}  // namespace chorus::torch_ext
