#include "c10d/tensors.h"

#include <algorithm>

#include <torch/version.h>

#include "chorus/error.h"
#include "chorus/torch/process_group.h"

namespace chorus::c10d_backend {

using torch_ext::to_chorus_dtype;


[[noreturn]] void refuse(const std::string& op, const std::string& why) {
  throw InvalidArgumentError("chorus " + op + ": " + why);
}


std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

std::string describe(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + shape_of(t);
}

namespace {

void check_cpu(const at::Tensor& t, const std::string& op, const std::string& what) {
  if (!t.device().is_cpu()) {
    refuse(op, what + " is on " + t.device().str() +
                   "; the chorus backend takes CPU tensors (move it with .cpu())");
  }
}

}  // namespace

void check_tensor(const at::Tensor& t, const std::string& op, const std::string& what) {
  if (!t.defined()) refuse(op, what + " is undefined");
  check_cpu(t, op, what);
  if (t.layout() != at::kStrided) {
    refuse(op, what + " has layout " + c10::str(t.layout()) + "; chorus " + op +
                   " takes dense tensors (of sparse ones, chorus only sums sparse COO tensors, "
                   "with allreduce)");
  }
}

void check_sparse(const at::Tensor& t, const ::c10d::ReduceOp& torch_op, const std::string& op) {
  check_cpu(t, op, "tensor");
  const auto type = static_cast<::c10d::ReduceOp::RedOpType>(torch_op);
  if (type != ::c10d::ReduceOp::SUM) {
    refuse(op, std::string("ReduceOp.") + torch_op_name(type) +
                   " of sparse tensors is not supported: sparse tensors are summed "
                   "(ReduceOp.SUM), as gloo does");
  }
  // The dtypes gloo's sparse allreduce moves (its transport's types); gloo then adds
  // with ATen, which lacks some (Half on torch 1.x, Bool): where two ranks' nonzeros
  // meet, gloo's addition fails, and chorus's, the same, fails alike.
  static const std::vector<at::ScalarType> gloo_moves{
      at::kFloat, at::kDouble, at::kHalf, at::kChar, at::kByte, at::kInt, at::kLong,
#if TORCH_VERSION_MAJOR >= 2
      at::kBFloat16, at::kBool,
#endif
  };
  if (std::find(gloo_moves.begin(), gloo_moves.end(), t.scalar_type()) == gloo_moves.end()) {
    std::string names;
    for (at::ScalarType dtype : gloo_moves) {
      names += (names.empty() ? "" : ", ") + std::string(c10::toString(dtype));
    }
    refuse(op, std::string("sparse ") + c10::toString(t.scalar_type()) +
                   " tensors are not supported: on torch " + TORCH_VERSION +
                   ", chorus sums the sparse dtypes gloo does (" + names + ")");
  }
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const std::string& op,
                   const std::string& what) {
  if (tensors.size() != 1) {
    refuse(op, "takes one " + what + " per process, got a list of " +
                   std::to_string(tensors.size()) + " (one device per process)");
  }
  check_tensor(tensors[0], op, what);
  return tensors[0];
}

const char* torch_op_name(::c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case ::c10d::ReduceOp::SUM: return "SUM";
    case ::c10d::ReduceOp::AVG: return "AVG";
    case ::c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case ::c10d::ReduceOp::MIN: return "MIN";
    case ::c10d::ReduceOp::MAX: return "MAX";
    case ::c10d::ReduceOp::BAND: return "BAND";
    case ::c10d::ReduceOp::BOR: return "BOR";
    case ::c10d::ReduceOp::BXOR: return "BXOR";
    case ::c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNKNOWN";
  }
}

Reduction reduction_of(const at::Tensor& t, const ::c10d::ReduceOp& torch_op,
                       const std::string& op) {
  const auto type = static_cast<::c10d::ReduceOp::RedOpType>(torch_op);
  std::optional<ReduceOp> chorus_op;
  switch (type) {
    case ::c10d::ReduceOp::SUM: chorus_op = ReduceOp::kSum; break;
    case ::c10d::ReduceOp::AVG: chorus_op = ReduceOp::kAvg; break;
    case ::c10d::ReduceOp::PRODUCT: chorus_op = ReduceOp::kProd; break;
    case ::c10d::ReduceOp::MIN: chorus_op = ReduceOp::kMin; break;
    case ::c10d::ReduceOp::MAX: chorus_op = ReduceOp::kMax; break;
#if TORCH_VERSION_MAJOR >= 2
    case ::c10d::ReduceOp::PREMUL_SUM:
      if (torch_op.supplement_) chorus_op = ReduceOp::kSum;  // premultiplied() scaled it
      break;
#endif
    default: break;
  }
  if (!chorus_op) {
    refuse(op, std::string("chorus has no kernel for ReduceOp.") + torch_op_name(type) +
                   " (it reduces with SUM, AVG, PRODUCT, MIN, MAX and, on torch 2.x, PREMUL_SUM)");
  }
  const at::ScalarType st = t.scalar_type();
  if (auto dtype = to_chorus_dtype(st)) return {*dtype, *chorus_op};
  if (st == at::kComplexFloat || st == at::kComplexDouble) {
    if (*chorus_op != ReduceOp::kSum && *chorus_op != ReduceOp::kAvg) {
      refuse(op, std::string("ReduceOp.") + torch_op_name(type) + " is not defined for " +
                     c10::toString(st) + " (complex tensors reduce with SUM and AVG)");
    }
    return {st == at::kComplexFloat ? DataType::kFloat32 : DataType::kFloat64, *chorus_op, 2};
  }
  if (st == at::kBool) {
    if (*chorus_op == ReduceOp::kSum || *chorus_op == ReduceOp::kAvg) {
      refuse(op, std::string("ReduceOp.") + torch_op_name(type) +
                     " of Bool tensors is not supported (MIN, MAX and PRODUCT are)");
    }
    return {DataType::kUInt8, *chorus_op};
  }
  refuse(op, std::string("the ") + c10::toString(st) + " tensor " + shape_of(t) +
                 " has a dtype chorus cannot reduce (float32/64, float16, bfloat16, int8, "
                 "uint8, int32, int64, complex64/128, bool)");
}

at::Tensor premultiplied(const at::Tensor& t, const ::c10d::ReduceOp& torch_op) {
#if TORCH_VERSION_MAJOR >= 2
  if (static_cast<::c10d::ReduceOp::RedOpType>(torch_op) == ::c10d::ReduceOp::PREMUL_SUM &&
      torch_op.supplement_) {
    const auto* factor = dynamic_cast<const ::c10d::PreMulSumSupplement*>(torch_op.supplement_.get());
    if (factor == nullptr) refuse("reduce", "ReduceOp.PREMUL_SUM carries no factor chorus can read");
    if (factor->tensor_factor.defined()) {
      return t.mul(factor->tensor_factor.to(t.device()).to(t.scalar_type()));
    }
    return t.mul(factor->double_factor);
  }
#endif
  return t;
}

Moved moved_of(const at::Tensor& t) {
  if (auto dtype = to_chorus_dtype(t.scalar_type())) return {*dtype, 1};
  return {DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

size_t elems(const at::Tensor& t, size_t width) { return static_cast<size_t>(t.numel()) * width; }

at::Tensor staged_in(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
at::Tensor staged_out(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
}

ChorusWork::Finisher copy_back(const at::Tensor& t, const at::Tensor& staged) {
  if (staged.is_same(t)) return nullptr;
  return [t, staged]() mutable { t.copy_(staged); };
}

at::Tensor packed(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  flat.reserve(parts.size());
  for (const at::Tensor& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

ChorusWork::Finisher unpack_into(std::vector<at::Tensor> outputs, at::Tensor flat) {
  return [outputs = std::move(outputs), flat]() mutable {
    int64_t offset = 0;
    for (at::Tensor& out : outputs) {
      out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
      offset += out.numel();
    }
  };
}

at::Tensor packed_padded(const std::vector<at::Tensor>& parts, int64_t block) {
  at::Tensor flat = at::zeros({static_cast<int64_t>(parts.size()) * block}, parts.at(0).options());
  for (size_t i = 0; i < parts.size(); ++i) {
    flat.narrow(0, static_cast<int64_t>(i) * block, parts[i].numel()).copy_(parts[i].reshape({-1}));
  }
  return flat;
}

ChorusWork::Finisher copy_block(const at::Tensor& out, at::Tensor flat, int64_t offset) {
  return [out, flat, offset]() mutable {
    out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
  };
}

void check_like(const at::Tensor& t, const at::Tensor& like, const std::string& op,
                const std::string& what, const std::string& like_what) {
  check_tensor(t, op, what);
  if (t.scalar_type() != like.scalar_type() || t.numel() != like.numel()) {
    refuse(op, what + " is " + describe(t) + " but " + like_what + " is " + describe(like) +
                   " (they must have the same dtype and number of elements)");
  }
}

void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t expected,
                const std::string& op, const std::string& what, const std::string& like_what) {
  if (list.size() != expected) {
    refuse(op, what + " has " + std::to_string(list.size()) + " tensors; expected " +
                   std::to_string(expected) + " (one per rank)");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    check_like(list[i], like, op, what + "[" + std::to_string(i) + "]", like_what);
  }
}

bool check_ranks_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int expected,
                      int rank, const std::string& op, const std::string& what,
                      const std::string& like_what) {
  if (list.size() != static_cast<size_t>(expected)) {
    refuse(op, what + " has " + std::to_string(list.size()) + " tensors; expected " +
                   std::to_string(expected) + " (one per rank)");
  }
  bool even = true;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = what + "[" + std::to_string(i) + "]";
    check_tensor(list[i], op, name);
    if (list[i].scalar_type() != like.scalar_type()) {
      refuse(op, name + " is " + describe(list[i]) + " but " + like_what + " is " +
                     describe(like) + " (they must have the same dtype)");
    }
    even = even && list[i].numel() == like.numel();
  }
  check_like(list[rank], like, op, what + "[" + std::to_string(rank) + "] (this rank's)", like_what);
  return even;
}

void check_timeout(std::chrono::milliseconds requested, const GroupTimeout& group, const std::string& op) {
  if (requested != ::c10d::kUnsetTimeout && !group.is(requested)) {
    refuse(op, "a per-call timeout (" + std::to_string(requested.count()) +
                   " ms) is not supported; the group's timeout (" +
                   std::to_string(group.applies.count()) +
                   " ms: CHORUS_TIMEOUT's or HCCL_EXEC_TIMEOUT's when set, else "
                   "init_process_group's) applies");
  }
}

void check_root(int64_t root, int size, const std::string& op) {
  if (root < 0 || root >= size) {
    refuse(op, "root rank " + std::to_string(root) + " is out of range [0, " +
                   std::to_string(size) + ")");
  }
}

void check_root_tensor(int64_t root_tensor, const std::string& op) {
  if (root_tensor != 0) {
    refuse(op, "root tensor " + std::to_string(root_tensor) + " (one tensor per process)");
  }
}

void check_one_dtype(const std::vector<at::Tensor>& list, const std::string& op,
                     const std::string& what) {
  if (list.empty()) refuse(op, "the list of " + what + " is empty");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string name = what + "[" + std::to_string(i) + "]";
    check_tensor(list[i], op, name);
    if (list[i].scalar_type() != list[0].scalar_type()) {
      refuse(op, name + " is " + describe(list[i]) + " but " + what + "[0] is " +
                     describe(list[0]) + " (one dtype for all)");
    }
  }
}

void check_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     int size, bool gather, const std::string& op) {
  check_one_dtype(inputs, op, "inputs");
  if (outputs.size() != inputs.size()) {
    refuse(op, std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) +
                   " inputs (one output per input)");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string index = "[" + std::to_string(i) + "]";
    check_tensor(outputs[i], op, "outputs" + index);
    if (gather && !outputs[i].is_contiguous()) {
      refuse(op, "outputs" + index + " " + describe(outputs[i]) + " is not contiguous");
    }
    const at::Tensor& large = gather ? outputs[i] : inputs[i];
    const at::Tensor& small = gather ? inputs[i] : outputs[i];
    const std::string large_what = gather ? "output" : "input";
    const std::string small_what = gather ? "input" : "output";
    if (large.scalar_type() != small.scalar_type() || large.numel() != size * small.numel()) {
      refuse(op, large_what + "s" + index + " is " + describe(large) + " but " + small_what + "s" +
                     index + " is " + describe(small) + "; each " + large_what +
                     " must hold world size (" + std::to_string(size) + ") times its " +
                     small_what + "'s elements, of the same dtype");
    }
  }
}

std::vector<size_t> displacements(const std::vector<size_t>& counts) {
  std::vector<size_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  return displs;
}

std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 size_t width, const std::string& op, const std::string& what) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t row_elems = rows == 0 ? 0 : static_cast<size_t>(t.numel() / rows) * width;
  std::vector<size_t> counts(size);
  if (splits.empty()) {
    if (rows % size != 0) {
      refuse(op, what + " " + describe(t) + " has " + std::to_string(rows) +
                     " rows, which do not split evenly over " + std::to_string(size) +
                     " ranks (pass split sizes)");
    }
    std::fill(counts.begin(), counts.end(), static_cast<size_t>(rows / size) * row_elems);
    return counts;
  }
  if (splits.size() != static_cast<size_t>(size)) {
    refuse(op, what + " split sizes have " + std::to_string(splits.size()) +
                   " entries; expected one per rank (" + std::to_string(size) + ")");
  }
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    if (splits[r] < 0) refuse(op, what + " split size " + std::to_string(splits[r]) + " is negative");
    total += splits[r];
    counts[r] = static_cast<size_t>(splits[r]) * row_elems;
  }
  if (total != rows) {
    refuse(op, what + " split sizes add up to " + std::to_string(total) + " rows, but " + what +
                   " " + describe(t) + " has " + std::to_string(rows));
  }
  return counts;
}

}  // namespace chorus::c10d_backend
