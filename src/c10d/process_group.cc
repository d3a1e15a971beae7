#include "c10d/process_group.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

#include "c10d/sparse_allreduce.h"
#include "c10d/store_adapter.h"
#include "c10d/tensors.h"

namespace chorus::c10d_backend {

using ::c10d::OpType;

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : BackendBase(rank, size), comms_(std::make_shared<Comms>()) {
  // CHORUS_TIMEOUT, when set, wins over `timeout` (and says so): timeout_.applies is
  // the one every operation ends by; the per-call and setTimeout() checks accept it and
  // the program's own (torch passes the group's back on some calls).
  CommOptions options = CommOptions::from_env(timeout);
  timeout_ = GroupTimeout{options.timeout, timeout};
  options.connect_timeout = std::min(options.connect_timeout, timeout_.applies);
  auto chorus_store = std::make_shared<C10dStore>(store);
  chorus_store->set_timeout(options.connect_timeout);
  options.comm_id = "torch";
  comms_->collectives = Communicator::create(chorus_store, rank, size, options);
  options.comm_id = "torch/p2p-up";
  comms_->p2p[0] = Communicator::create(chorus_store, rank, size, options);
  options.comm_id = "torch/p2p-down";
  comms_->p2p[1] = Communicator::create(chorus_store, rank, size, options);
  stages_ = std::make_shared<Stages>(comms_->collectives);
  completer_ = std::make_shared<Completer>();
}

ProcessGroupChorus::~ProcessGroupChorus() {
  // Every operation ends within the group's timeout; finish them all before the
  // communicators close.
  std::deque<c10::intrusive_ptr<ChorusWork>> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& work : pending) work->complete();
  completer_.reset();
}

bool ProcessGroupChorus::drain_callbacks() {
  return completer_->drain(std::chrono::steady_clock::now() + timeout_.applies);
}

ProcessGroupChorus::Ptr ProcessGroupChorus::launch(OpType type, Work operation,
                                                   std::vector<at::Tensor> outputs,
                                                   ChorusWork::Finisher finish,
                                                   std::vector<at::Tensor> keep, Work partner,
                                                   ChorusWork::LaterDone later_done) {
  ++sequence_;
  auto work = c10::make_intrusive<ChorusWork>(rank_, type, std::move(operation), std::move(outputs),
                                              std::move(finish), std::move(keep), comms_,
                                              completer_, std::move(partner), std::move(later_done));
  std::lock_guard<std::mutex> lock(pending_mutex_);
  while (!pending_.empty() && pending_.front()->operation_done()) pending_.pop_front();
  pending_.push_back(work);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

ProcessGroupChorus::Ptr ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                      const ::c10d::BroadcastOptions& opts) {
  const std::string op = "broadcast";
  at::Tensor& t = single(tensors, op);
  check_timeout(opts.timeout, timeout_, op);
  check_root(opts.rootRank, size_, op);
  check_root_tensor(opts.rootTensor, op);
  const Moved m = moved_of(t);
  at::Tensor buf = staged_in(t);
  Work w = comm().broadcast(buf.data_ptr(), buf.data_ptr(), elems(buf, m.width), m.dtype,
                            static_cast<int>(opts.rootRank));
  return launch(OpType::BROADCAST, w, {t}, copy_back(t, buf), {buf});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                      const ::c10d::AllreduceOptions& opts) {
  const std::string op = "allreduce";
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    return sparse_allreduce(tensors[0], opts);
  }
  at::Tensor& t = single(tensors, op);
  check_timeout(opts.timeout, timeout_, op);
  const Reduction r = reduction_of(t, opts.reduceOp, op);
  at::Tensor buf = premultiplied(staged_in(t), opts.reduceOp);
  Work w = comm().allreduce(buf.data_ptr(), buf.data_ptr(), elems(buf, r.width), r.dtype, r.op);
  return launch(OpType::ALLREDUCE, w, {t}, copy_back(t, buf), {buf});
}

// The work's first operation is the header exchange; the data exchange is issued later
// (stages.h), by whichever comes first: the next operation of the group, a wait, the
// completion thread of its future, or a poll of isCompleted() that finds the headers in.
ProcessGroupChorus::Ptr ProcessGroupChorus::sparse_allreduce(at::Tensor& t,
                                                             const ::c10d::AllreduceOptions& opts) {
  const std::string op = "allreduce";
  check_sparse(t, opts.reduceOp, op);
  check_timeout(opts.timeout, timeout_, op);
  auto sparse = std::make_shared<SparseAllreduce>(t, rank_, size_);
  stages_->start(sparse);
  auto finish = [stages = stages_, sparse, t]() mutable {
    stages->advance(sparse.get(), /*wait=*/true);
    sparse->finish(t);
  };
  auto later_done = [stages = stages_, sparse] {
    return stages->advance(sparse.get(), /*wait=*/false) && sparse->done();
  };
  return launch(OpType::ALLREDUCE, sparse->headers_work(), {t}, std::move(finish), {},
                Work{}, std::move(later_done));
}

ProcessGroupChorus::Ptr ProcessGroupChorus::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  const std::string op = "allreduce_coalesced";
  check_timeout(opts.timeout, timeout_, op);
  check_one_dtype(tensors, op, "tensors");
  const Reduction r = reduction_of(tensors[0], opts.reduceOp, op);
  at::Tensor flat = premultiplied(packed(tensors), opts.reduceOp);
  Work w = comm().allreduce(flat.data_ptr(), flat.data_ptr(), elems(flat, r.width), r.dtype, r.op);
  return launch(OpType::ALLREDUCE_COALESCED, w, tensors, unpack_into(tensors, flat), {flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                   const ::c10d::ReduceOptions& opts) {
  const std::string op = "reduce";
  at::Tensor& t = single(tensors, op);
  check_timeout(opts.timeout, timeout_, op);
  check_root(opts.rootRank, size_, op);
  check_root_tensor(opts.rootTensor, op);
  const Reduction r = reduction_of(t, opts.reduceOp, op);
  at::Tensor buf = premultiplied(staged_in(t), opts.reduceOp);
  Work w = comm().reduce(buf.data_ptr(), buf.data_ptr(), elems(buf, r.width), r.dtype, r.op,
                         static_cast<int>(opts.rootRank));
  return launch(OpType::REDUCE, w, {t}, copy_back(t, buf), {buf});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const ::c10d::AllgatherOptions& opts) {
  const std::string op = "allgather";
  at::Tensor& in = single(inputs, op, "input");
  check_timeout(opts.timeout, timeout_, op);
  if (outputs.size() != 1) refuse(op, "takes one output list per process, got " + std::to_string(outputs.size()));
  const bool even = check_ranks_list(outputs[0], in, size_, rank_, op, "output list", "the input");
  const Moved m = moved_of(in);
  at::Tensor src = staged_in(in);
  if (!even) {
    // Rank r's block is outputs[r]'s size: chorus's allgatherv.
    std::vector<size_t> counts;
    int64_t total = 0;
    for (const at::Tensor& o : outputs[0]) {
      counts.push_back(elems(o, m.width));
      total += o.numel();
    }
    at::Tensor flat = at::empty({total}, in.options());
    Work w = comm().allgatherv(src.data_ptr(), elems(src, m.width), flat.data_ptr(), counts, {},
                               m.dtype);
    return launch(OpType::ALLGATHER, w, outputs[0], unpack_into(outputs[0], flat), {src, flat});
  }
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  Work w = comm().allgather(src.data_ptr(), flat.data_ptr(), elems(src, m.width), m.dtype);
  return launch(OpType::ALLGATHER, w, outputs[0], unpack_into(outputs[0], flat), {src, flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const ::c10d::AllgatherOptions& opts) {
  const std::string op = "allgather_into_tensor";
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  check_timeout(opts.timeout, timeout_, op);
  if (output.scalar_type() != input.scalar_type() || output.numel() != size_ * input.numel()) {
    refuse(op, "output is " + describe(output) + " but input is " + describe(input) +
                   "; the output must hold world size (" + std::to_string(size_) +
                   ") times the input's elements, of the same dtype");
  }
  const Moved m = moved_of(input);
  at::Tensor src = staged_in(input);
  at::Tensor dst = staged_out(output);
  Work w = comm().allgather(src.data_ptr(), dst.data_ptr(), elems(src, m.width), m.dtype);
  return launch(OpType::_ALLGATHER_BASE, w, {output}, copy_back(output, dst), {src, dst});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  const std::string op = "allgather_coalesced";
  check_timeout(opts.timeout, timeout_, op);
  check_one_dtype(inputs, op, "inputs");
  if (outputs.size() != static_cast<size_t>(size_)) {
    refuse(op, "the output has " + std::to_string(outputs.size()) + " lists; expected one per rank (" +
                   std::to_string(size_) + ")");
  }
  std::vector<at::Tensor> flat_outputs;
  for (int r = 0; r < size_; ++r) {
    if (outputs[r].size() != inputs.size()) {
      refuse(op, "output list " + std::to_string(r) + " has " + std::to_string(outputs[r].size()) +
                     " tensors; expected one per input (" + std::to_string(inputs.size()) + ")");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_like(outputs[r][i], inputs[i], op,
                 "output[" + std::to_string(r) + "][" + std::to_string(i) + "]",
                 "inputs[" + std::to_string(i) + "]");
      flat_outputs.push_back(outputs[r][i]);
    }
  }
  const Moved m = moved_of(inputs[0]);
  at::Tensor src = packed(inputs);
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * src.numel()}, src.options());
  Work w = comm().allgather(src.data_ptr(), flat.data_ptr(), elems(src, m.width), m.dtype);
  return launch(OpType::ALLGATHER_COALESCED, w, flat_outputs, unpack_into(flat_outputs, flat),
                {src, flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const ::c10d::GatherOptions& opts) {
  const std::string op = "gather";
  at::Tensor& in = single(inputs, op, "input");
  check_timeout(opts.timeout, timeout_, op);
  check_root(opts.rootRank, size_, op);
  const int root = static_cast<int>(opts.rootRank);
  const Moved m = moved_of(in);
  at::Tensor src = staged_in(in);
  if (rank_ != root) {
    if (!outputs.empty() && !outputs[0].empty()) {
      refuse(op, "rank " + std::to_string(rank_) + " is not the root (" + std::to_string(root) +
                     ") and must pass no gather list");
    }
    Work w = comm().gather(src.data_ptr(), nullptr, elems(src, m.width), m.dtype, root);
    return launch(OpType::GATHER, w, {}, nullptr, {src});
  }
  if (outputs.size() != 1) refuse(op, "the root takes one gather list, got " + std::to_string(outputs.size()));
  check_list(outputs[0], in, size_, op, "gather list", "the input");
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  Work w = comm().gather(src.data_ptr(), flat.data_ptr(), elems(src, m.width), m.dtype, root);
  return launch(OpType::GATHER, w, outputs[0], unpack_into(outputs[0], flat), {src, flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const ::c10d::ScatterOptions& opts) {
  const std::string op = "scatter";
  at::Tensor& out = single(outputs, op, "output");
  check_timeout(opts.timeout, timeout_, op);
  check_root(opts.rootRank, size_, op);
  const int root = static_cast<int>(opts.rootRank);
  const Moved m = moved_of(out);
  at::Tensor dst = staged_out(out);
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1) refuse(op, "the root takes one scatter list, got " + std::to_string(inputs.size()));
    check_list(inputs[0], out, size_, op, "scatter list", "the output");
    flat = packed(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    refuse(op, "rank " + std::to_string(rank_) + " is not the root (" + std::to_string(root) +
                   ") and must pass no scatter list");
  }
  Work w = comm().scatter(flat.defined() ? flat.data_ptr() : nullptr, dst.data_ptr(),
                          elems(dst, m.width), m.dtype, root);
  std::vector<at::Tensor> keep{dst};
  if (flat.defined()) keep.push_back(flat);
  return launch(OpType::SCATTER, w, {out}, copy_back(out, dst), std::move(keep));
}

ProcessGroupChorus::Ptr ProcessGroupChorus::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter";
  at::Tensor& out = single(outputs, op, "output");
  check_timeout(opts.timeout, timeout_, op);
  if (inputs.size() != 1) refuse(op, "takes one input list per process, got " + std::to_string(inputs.size()));
  if (!check_ranks_list(inputs[0], out, size_, rank_, op, "input list", "the output")) {
    return reduce_scatter_uneven(out, inputs[0], opts);
  }
  const Reduction r = reduction_of(out, opts.reduceOp, op);
  at::Tensor flat = premultiplied(packed(inputs[0]), opts.reduceOp);
  at::Tensor dst = staged_out(out);
  Work w = comm().reduce_scatter(flat.data_ptr(), dst.data_ptr(), elems(dst, r.width), r.dtype, r.op);
  return launch(OpType::REDUCE_SCATTER, w, {out}, copy_back(out, dst), {flat, dst});
}

// Rank r's block is inputs[r]'s size. Chorus reduce-scatters blocks padded to the
// largest (every rank pads block r alike, and the padding is never read back), unless
// the padding would move more than an allreduce of the unpadded blocks does (a ring
// moves (size-1)/size of size*largest against 2*(size-1)/size of the total): then that
// allreduce, of which each rank keeps its block.
ProcessGroupChorus::Ptr ProcessGroupChorus::reduce_scatter_uneven(
    at::Tensor& out, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  const Reduction r = reduction_of(out, opts.reduceOp, "reduce_scatter");
  int64_t largest = 0, total = 0, offset = 0;
  for (int k = 0; k < size_; ++k) {
    largest = std::max(largest, inputs[k].numel());
    total += inputs[k].numel();
    if (k < rank_) offset += inputs[k].numel();
  }
  if (size_ * largest > 2 * total) {
    at::Tensor flat = premultiplied(packed(inputs), opts.reduceOp);
    Work w = comm().allreduce(flat.data_ptr(), flat.data_ptr(), elems(flat, r.width), r.dtype, r.op);
    return launch(OpType::REDUCE_SCATTER, w, {out}, copy_block(out, flat, offset), {flat});
  }
  at::Tensor flat = premultiplied(packed_padded(inputs, largest), opts.reduceOp);
  at::Tensor dst = at::empty({largest}, flat.options());
  Work w = comm().reduce_scatter(flat.data_ptr(), dst.data_ptr(), elems(dst, r.width), r.dtype, r.op);
  return launch(OpType::REDUCE_SCATTER, w, {out}, copy_block(out, dst, 0), {flat, dst});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter_tensor";
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  check_timeout(opts.timeout, timeout_, op);
  if (output.scalar_type() != input.scalar_type() || input.numel() != size_ * output.numel()) {
    refuse(op, "input is " + describe(input) + " but output is " + describe(output) +
                   "; the input must hold world size (" + std::to_string(size_) +
                   ") times the output's elements, of the same dtype");
  }
  const Reduction r = reduction_of(output, opts.reduceOp, op);
  at::Tensor src = premultiplied(staged_in(input), opts.reduceOp);
  at::Tensor dst = staged_out(output);
  Work w = comm().reduce_scatter(src.data_ptr(), dst.data_ptr(), elems(dst, r.width), r.dtype, r.op);
  return launch(OpType::_REDUCE_SCATTER_BASE, w, {output}, copy_back(output, dst), {src, dst});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const ::c10d::AllToAllOptions& opts) {
  const std::string op = "all_to_all_single";
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  check_timeout(opts.timeout, timeout_, op);
  if (output.scalar_type() != input.scalar_type()) {
    refuse(op, "output is " + describe(output) + " but input is " + describe(input) +
                   " (they must have the same dtype)");
  }
  const Moved m = moved_of(input);
  at::Tensor src = staged_in(input);
  at::Tensor dst = staged_out(output);
  if (output_splits.empty() && input_splits.empty()) {
    if (input.numel() != output.numel() || input.numel() % size_ != 0) {
      refuse(op, "input " + describe(input) + " and output " + describe(output) +
                     " must have the same number of elements, divisible by the world size (" +
                     std::to_string(size_) + ")");
    }
    Work w = comm().alltoall(src.data_ptr(), dst.data_ptr(), elems(src, m.width) / size_, m.dtype);
    return launch(OpType::ALLTOALL_BASE, w, {output}, copy_back(output, dst), {src, dst});
  }
  std::vector<size_t> send_counts = split_counts(input, input_splits, size_, m.width, op, "input");
  std::vector<size_t> recv_counts = split_counts(output, output_splits, size_, m.width, op, "output");
  std::vector<size_t> send_displs = displacements(send_counts);
  std::vector<size_t> recv_displs = displacements(recv_counts);
  Work w = comm().alltoallv(src.data_ptr(), send_counts, send_displs, dst.data_ptr(), recv_counts,
                            recv_displs, m.dtype);
  return launch(OpType::ALLTOALL_BASE, w, {output}, copy_back(output, dst), {src, dst});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const ::c10d::AllToAllOptions& opts) {
  const std::string op = "all_to_all";
  check_timeout(opts.timeout, timeout_, op);
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != static_cast<size_t>(size_)) {
    refuse(op, "takes one input and one output tensor per rank (" + std::to_string(size_) +
                   "), got " + std::to_string(inputs.size()) + " inputs and " +
                   std::to_string(outputs.size()) + " outputs");
  }
  for (int r = 0; r < size_; ++r) {
    check_tensor(inputs[r], op, "inputs[" + std::to_string(r) + "]");
    check_tensor(outputs[r], op, "outputs[" + std::to_string(r) + "]");
    if (inputs[r].scalar_type() != inputs[0].scalar_type() ||
        outputs[r].scalar_type() != inputs[0].scalar_type()) {
      refuse(op, "every input and output must have one dtype; inputs[0] is " +
                     describe(inputs[0]) + ", inputs[" + std::to_string(r) + "] " +
                     describe(inputs[r]) + ", outputs[" + std::to_string(r) + "] " +
                     describe(outputs[r]));
    }
  }
  const Moved m = moved_of(inputs[0]);
  std::vector<size_t> send_counts(size_), recv_counts(size_);
  for (int r = 0; r < size_; ++r) {
    send_counts[r] = elems(inputs[r], m.width);
    recv_counts[r] = elems(outputs[r], m.width);
  }
  at::Tensor src = packed(inputs);
  const int64_t out_numel = std::accumulate(outputs.begin(), outputs.end(), int64_t{0},
                                            [](int64_t n, const at::Tensor& t) { return n + t.numel(); });
  at::Tensor flat = at::empty({out_numel}, outputs[0].options());
  Work w = comm().alltoallv(src.data_ptr(), send_counts, displacements(send_counts), flat.data_ptr(),
                            recv_counts, displacements(recv_counts), m.dtype);
  return launch(OpType::ALLTOALL, w, outputs, unpack_into(outputs, flat), {src, flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                 int tag) {
  const std::string op = "send";
  at::Tensor& t = single(tensors, op);
  check_root(dst_rank, size_, op);
  const Moved m = moved_of(t);
  at::Tensor buf = staged_in(t);
  Work w = p2p_to(dst_rank).send(buf.data_ptr(), elems(buf, m.width), m.dtype, dst_rank, tag);
  return launch(OpType::SEND, w, {t}, nullptr, {buf});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                 int tag) {
  const std::string op = "recv";
  at::Tensor& t = single(tensors, op);
  check_root(src_rank, size_, op);
  const Moved m = moved_of(t);
  at::Tensor buf = staged_out(t);
  Work w = p2p_from(src_rank).recv(buf.data_ptr(), elems(buf, m.width), m.dtype, src_rank, tag);
  return launch(OpType::RECV, w, {t}, copy_back(t, buf), {buf});
}

// The lower ranks' messages come on p2p[0] and the higher ranks' on p2p[1]: the receive
// is issued on both with one claim, and the first to find a message with `tag` takes
// it (the other completes without one). Each is issued now, so that receives issued
// later on either communicator cannot overtake it.
ProcessGroupChorus::Ptr ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const std::string op = "recv";
  at::Tensor& t = single(tensors, op);
  if (size_ == 1) refuse(op, "a receive from any source needs another rank (world size 1)");
  const Moved m = moved_of(t);
  at::Tensor buf = staged_out(t);
  std::vector<int> lower, higher;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) (r < rank_ ? lower : higher).push_back(r);
  }
  auto claim = lower.empty() || higher.empty() ? nullptr : std::make_shared<RecvClaim>();
  Work first, second;
  if (!lower.empty()) {
    first = comms_->p2p[0]->recv_any(buf.data_ptr(), elems(buf, m.width), m.dtype, tag, lower, claim);
  }
  if (!higher.empty()) {
    (lower.empty() ? first : second) =
        comms_->p2p[1]->recv_any(buf.data_ptr(), elems(buf, m.width), m.dtype, tag, higher, claim);
  }
  return launch(OpType::RECVANYSOURCE, first, {t}, copy_back(t, buf), {buf}, second);
}

ProcessGroupChorus::Ptr ProcessGroupChorus::barrier(const ::c10d::BarrierOptions& opts) {
  check_timeout(opts.timeout, timeout_, "barrier");
  return launch(OpType::BARRIER, comm().barrier(), {}, nullptr, {});
}

#if TORCH_VERSION_MAJOR >= 2
ProcessGroupChorus::Ptr ProcessGroupChorus::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  const std::string op = "allgather_into_tensor_coalesced";
  check_timeout(opts.timeout, timeout_, op);
  check_coalesced(outputs, inputs, size_, /*gather=*/true, op);
  // One allgather of the packed inputs: rank r's block holds its inputs one after
  // another; output i takes every rank's part i.
  const Moved m = moved_of(inputs[0]);
  at::Tensor src = packed(inputs);
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * src.numel()}, src.options());
  Work w = comm().allgather(src.data_ptr(), flat.data_ptr(), elems(src, m.width), m.dtype);
  std::vector<at::Tensor> targets;  // rank-major: rank r's part of output i
  for (int r = 0; r < size_; ++r) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      targets.push_back(outputs[i].view({-1}).narrow(0, r * inputs[i].numel(), inputs[i].numel()));
    }
  }
  return launch(OpType::COALESCED, w, outputs, unpack_into(std::move(targets), flat), {src, flat});
}

ProcessGroupChorus::Ptr ProcessGroupChorus::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  const std::string op = "reduce_scatter_tensor_coalesced";
  check_timeout(opts.timeout, timeout_, op);
  check_coalesced(outputs, inputs, size_, /*gather=*/false, op);
  const Reduction r = reduction_of(inputs[0], opts.reduceOp, op);
  // One reduce-scatter: rank r's block is every input's part r, one after another.
  std::vector<at::Tensor> parts;
  for (int k = 0; k < size_; ++k) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      parts.push_back(inputs[i].reshape({-1}).narrow(0, k * outputs[i].numel(), outputs[i].numel()));
    }
  }
  at::Tensor src = premultiplied(packed(parts), opts.reduceOp);
  at::Tensor dst = at::empty({src.numel() / size_}, src.options());
  Work w = comm().reduce_scatter(src.data_ptr(), dst.data_ptr(), elems(dst, r.width), r.dtype, r.op);
  return launch(OpType::COALESCED, w, outputs, unpack_into(outputs, dst), {src, dst});
}

void ProcessGroupChorus::startCoalescing() {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  if (coalescing_) refuse("startCoalescing", "coalescing has already started on this group");
  coalescing_ = true;
  coalesced_.clear();
}

ProcessGroupChorus::Ptr ProcessGroupChorus::endCoalescing() {
  std::vector<c10::intrusive_ptr<ChorusWork>> works;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (!coalescing_) refuse("endCoalescing", "no startCoalescing before it on this group");
    coalescing_ = false;
    works.swap(coalesced_);
  }
  return c10::make_intrusive<CoalescedWork>(rank_, std::move(works));
}

void ProcessGroupChorus::abort() { comms_->abort_all("the process group was aborted (abort())"); }

void ProcessGroupChorus::shutdown() {
  std::deque<c10::intrusive_ptr<ChorusWork>> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& work : pending) work->complete();
  // The communicators close with the group (destroy_process_group drops it next).
}

void ProcessGroupChorus::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout_.is(timeout)) return;
  refuse("setTimeout", "the chorus group's timeout (" + std::to_string(timeout_.applies.count()) +
                           " ms) is fixed when it connects; " + std::to_string(timeout.count()) +
                           " ms cannot be set afterwards (pass it to init_process_group or "
                           "new_group; CHORUS_TIMEOUT or HCCL_EXEC_TIMEOUT, when set, wins)");
}
#endif

}  // namespace chorus::c10d_backend
