#include "chorus/torch/process_group.h"

#include <ATen/ATen.h>

#include "chorus/error.h"

namespace chorus::torch_ext {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check(const at::Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw InvalidArgumentError(std::string(op) + ": " + what + " is undefined");
  if (!t.device().is_cpu()) {
    throw InvalidArgumentError(std::string(op) + ": " + what + " is on " + t.device().str() +
                               "; chorus supports CPU tensors");
  }
  if (!t.is_contiguous()) {
    throw InvalidArgumentError(std::string(op) + ": " + what + " " + shape_of(t) +
                               " is not contiguous (call .contiguous())");
  }
}

// The elements of one row of `t`: its size past dim 0.
int64_t row_elements(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// alltoall's per-rank counts, in elements, of `t` ("input" or "output") cut along dim 0
// by `splits` (rows per rank; empty: equal blocks).
std::vector<size_t> alltoall_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                    const std::string& what) {
  const std::string arg = "alltoall: " + what + "_split_sizes";
  const int64_t rows = t.size(0), row = row_elements(t);
  if (splits.empty()) {
    if (rows % size != 0) {
      throw InvalidArgumentError("alltoall: " + what + " " + shape_of(t) + " has " + std::to_string(rows) +
                                 " rows, which do not split evenly over " + std::to_string(size) +
                                 " ranks; pass " + what + "_split_sizes");
    }
    return std::vector<size_t>(size, static_cast<size_t>(rows / size * row));
  }
  if (splits.size() != static_cast<size_t>(size)) {
    throw InvalidArgumentError(arg + " has " + std::to_string(splits.size()) +
                               " entries; expected one per rank (" + std::to_string(size) + ")");
  }
  std::vector<size_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    if (splits[r] < 0) {
      throw InvalidArgumentError(arg + "[" + std::to_string(r) + "] is " + std::to_string(splits[r]) +
                                 "; a split size cannot be negative");
    }
    total += splits[r];
    counts[r] = static_cast<size_t>(splits[r] * row);
  }
  if (total != rows) {
    throw InvalidArgumentError(arg + " add up to " + std::to_string(total) + " rows, but " + what + " " +
                               shape_of(t) + " has " + std::to_string(rows));
  }
  return counts;
}

// Whether the bytes of `a` and `b` overlap.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  const size_t a_bytes = a.numel() * a.element_size(), b_bytes = b.numel() * b.element_size();
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
  if (!comm_) throw InvalidArgumentError("ProcessGroup: communicator is null");
}

std::shared_ptr<ProcessGroup> ProcessGroup::from_env() {
  return std::make_shared<ProcessGroup>(Communicator::from_env());
}

std::shared_ptr<ProcessGroup> ProcessGroup::from_env(std::chrono::milliseconds timeout) {
  return std::make_shared<ProcessGroup>(Communicator::from_env(CommOptions::from_env(timeout)));
}

std::optional<DataType> to_chorus_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    default: return std::nullopt;
  }
}

DataType ProcessGroup::dtype_of(const at::Tensor& t, const char* what) {
  if (auto dtype = to_chorus_dtype(t.scalar_type())) return *dtype;
  throw InvalidArgumentError(std::string(what) + " has dtype " +
                             std::string(c10::toString(t.scalar_type())) +
                             ", which chorus does not reduce or move");
}

Work ProcessGroup::allreduce(const at::Tensor& t, ReduceOp op) {
  check(t, "allreduce", "tensor");
  return comm_->allreduce(t.data_ptr(), t.numel(), dtype_of(t, "allreduce: tensor"), op);
}

Work ProcessGroup::broadcast(const at::Tensor& t, int root) {
  check(t, "broadcast", "tensor");
  return comm_->broadcast(t.data_ptr(), t.numel(), dtype_of(t, "broadcast: tensor"), root);
}

Work ProcessGroup::reduce(const at::Tensor& t, int root, ReduceOp op) {
  check(t, "reduce", "tensor");
  return comm_->reduce(t.data_ptr(), t.data_ptr(), t.numel(), dtype_of(t, "reduce: tensor"), op,
                       root);
}

Work ProcessGroup::allgather(std::vector<at::Tensor>& output, const at::Tensor& input) {
  check(input, "allgather", "input");
  if (output.size() != static_cast<size_t>(size())) {
    throw InvalidArgumentError("allgather: output has " + std::to_string(output.size()) +
                               " tensors, expected one per rank (" + std::to_string(size()) + ")");
  }
  for (size_t r = 0; r < output.size(); ++r) {
    check(output[r], "allgather", "output tensor");
    if (output[r].sizes() != input.sizes() || output[r].scalar_type() != input.scalar_type()) {
      throw InvalidArgumentError("allgather: output[" + std::to_string(r) + "] " +
                                 shape_of(output[r]) + " does not match input " + shape_of(input));
    }
  }
  // Gather into one flat buffer, then copy out: the output tensors need not be adjacent.
  at::Tensor flat = at::empty({size() * input.numel()}, input.options());
  DataType dtype = dtype_of(input, "allgather: input");
  Work w = comm_->allgather(input.data_ptr(), flat.data_ptr(), input.numel(), dtype);
  w.wait();
  for (int r = 0; r < size(); ++r) {
    output[r].copy_(flat.narrow(0, r * input.numel(), input.numel()).view(input.sizes()));
  }
  return w;
}

Work ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check(output, "reduce_scatter", "output");
  check(input, "reduce_scatter", "input");
  if (input.numel() != output.numel() * size() || input.scalar_type() != output.scalar_type()) {
    throw InvalidArgumentError("reduce_scatter: input " + shape_of(input) + " must hold size (" +
                               std::to_string(size()) + ") blocks of output " + shape_of(output) +
                               " of the same dtype");
  }
  return comm_->reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(),
                               dtype_of(input, "reduce_scatter: input"), op);
}

Work ProcessGroup::alltoall(const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_split_sizes,
                           const std::vector<int64_t>& input_split_sizes) {
  check(output, "alltoall", "output");
  check(input, "alltoall", "input");
  if (input.dim() == 0 || output.dim() == 0) {
    throw InvalidArgumentError("alltoall: input " + shape_of(input) + " and output " + shape_of(output) +
                               " must have at least one dimension (they are cut along dim 0)");
  }
  if (input.scalar_type() != output.scalar_type()) {
    throw InvalidArgumentError(std::string("alltoall: output has dtype ") +
                               c10::toString(output.scalar_type()) + " but input " +
                               c10::toString(input.scalar_type()) + "; they must have the same dtype");
  }
  const DataType dtype = dtype_of(input, "alltoall: input");
  if (overlap(input, output)) {
    throw InvalidArgumentError("alltoall: input " + shape_of(input) + " and output " + shape_of(output) +
                               " share memory; pass separate tensors");
  }
  const std::vector<size_t> send_counts = alltoall_counts(input, input_split_sizes, size(), "input");
  const std::vector<size_t> recv_counts = alltoall_counts(output, output_split_sizes, size(), "output");
  return comm_->alltoallv(input.data_ptr(), send_counts, {}, output.data_ptr(), recv_counts, {}, dtype);
}

Work ProcessGroup::barrier() { return comm_->barrier(); }

Work ProcessGroup::send(const at::Tensor& t, int peer) {
  check(t, "send", "tensor");
  return comm_->send(t.data_ptr(), t.numel(), dtype_of(t, "send: tensor"), peer);
}

Work ProcessGroup::recv(const at::Tensor& t, int peer) {
  check(t, "recv", "tensor");
  return comm_->recv(t.data_ptr(), t.numel(), dtype_of(t, "recv: tensor"), peer);
}

}  // namespace chorus::torch_ext
