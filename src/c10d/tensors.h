// How the tensors of a torch.distributed call become chorus buffers: the checks that
// refuse a bad call before anything is sent, the element type and op chorus computes
// with, staging through contiguous copies, and packing lists into one buffer.
//
// Every check throws chorus::InvalidArgumentError ("chorus OP: why"), which Python
// sees as a RuntimeError; the group stays usable.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "c10d/work.h"
#include "chorus/types.h"

namespace chorus::c10d_backend {

[[noreturn]] void refuse(const std::string& op, const std::string& why);

// Describing tensors in messages: "[2, 3]", "Float[2, 3]".
std::string shape_of(const at::Tensor& t);
std::string describe(const at::Tensor& t);

// A defined, dense CPU tensor (a sparse one is refused naming allreduce, which sums
// sparse COO tensors).
void check_tensor(const at::Tensor& t, const std::string& op, const std::string& what);
// A sparse tensor allreduce sums: a CPU sparse COO tensor of a dtype gloo's sparse
// allreduce takes on this torch, and ReduceOp.SUM (gloo refuses every other op too).
void check_sparse(const at::Tensor& t, const ::c10d::ReduceOp& torch_op, const std::string& op);
// The one tensor a process passes: torch's lists of several are for several devices.
at::Tensor& single(std::vector<at::Tensor>& tensors, const std::string& op,
                   const std::string& what = "tensor");
// `t` has `like`'s dtype and number of elements.
void check_like(const at::Tensor& t, const at::Tensor& like, const std::string& op,
                const std::string& what, const std::string& like_what);
// `list` has `expected` tensors, each like `like`.
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t expected,
                const std::string& op, const std::string& what, const std::string& like_what);
// A list of one tensor per rank whose sizes may differ from rank to rank, as torch's
// all_gather and reduce_scatter allow (TorchRec's row-wise sharding passes such lists
// when the ranks' batches differ): `expected` tensors of `like`'s dtype, the one at
// `rank` with `like`'s number of elements. Returns whether every one has that number.
bool check_ranks_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int expected,
                      int rank, const std::string& op, const std::string& what,
                      const std::string& like_what);
// A group's timeout: the one that applies (CHORUS_TIMEOUT's when set) and the one the
// program gave (init_process_group's, new_group's), which torch may pass back per call.
struct GroupTimeout {
  std::chrono::milliseconds applies;
  std::chrono::milliseconds asked;
  bool is(std::chrono::milliseconds t) const { return t == applies || t == asked; }
};
// Only the group's timeout applies: a per-call one other than the group's is refused.
void check_timeout(std::chrono::milliseconds requested, const GroupTimeout& group, const std::string& op);
void check_root(int64_t root, int size, const std::string& op);
// One tensor per process: only root tensor 0.
void check_root_tensor(int64_t root_tensor, const std::string& op);
// A non-empty list of tensors (named `what` in messages) of one dtype.
void check_one_dtype(const std::vector<at::Tensor>& list, const std::string& op,
                     const std::string& what);
// The coalesced tensor collectives: non-empty inputs of one dtype and one output per
// input, of its dtype, the larger of each pair (the output when `gather`, else the
// input) world `size` times the other; outputs of a gather contiguous (they are
// filled through flat views).
void check_coalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     int size, bool gather, const std::string& op);

const char* torch_op_name(::c10d::ReduceOp::RedOpType op);

// How chorus reduces a tensor: its element type, the op, and how many chorus elements
// each tensor element is (2 for complex numbers, reduced as pairs of reals).
struct Reduction {
  DataType dtype;
  ReduceOp op;
  size_t width = 1;
};
Reduction reduction_of(const at::Tensor& t, const ::c10d::ReduceOp& torch_op,
                       const std::string& op);

// PREMUL_SUM (torch 2.x; FSDP2 reduce-scatters with it when a gradient divide factor is
// set): chorus sums `t` multiplied by the op's factor (a number or a one-element
// tensor), computed in a new tensor; any other op: `t` itself.
at::Tensor premultiplied(const at::Tensor& t, const ::c10d::ReduceOp& torch_op);

// How chorus moves a tensor that is not reduced: as its own element type where chorus
// has it, else as bytes. `width` chorus elements per tensor element.
struct Moved {
  DataType dtype;
  size_t width;
};
Moved moved_of(const at::Tensor& t);

// Chorus elements of `t` at `width` per tensor element.
size_t elems(const at::Tensor& t, size_t width);

// Contiguous memory with the tensor's values (the tensor itself when it is contiguous).
at::Tensor staged_in(const at::Tensor& t);
// Contiguous memory to receive into (the tensor itself when it is contiguous).
at::Tensor staged_out(const at::Tensor& t);
// Writes `staged` back into `t` once the operation is done; nullptr when they are one.
ChorusWork::Finisher copy_back(const at::Tensor& t, const at::Tensor& staged);

// One flat buffer holding `parts` one after another.
at::Tensor packed(const std::vector<at::Tensor>& parts);
// Copies consecutive blocks of `flat` (of each output's size) into `outputs`.
ChorusWork::Finisher unpack_into(std::vector<at::Tensor> outputs, at::Tensor flat);

// One flat buffer of `parts.size()` blocks of `block` elements, part i at the start of
// block i (every part at most `block` elements; the rest of each block is zero).
at::Tensor packed_padded(const std::vector<at::Tensor>& parts, int64_t block);
// Copies `out.numel()` elements of `flat` from `offset` on into `out`.
ChorusWork::Finisher copy_block(const at::Tensor& out, at::Tensor flat, int64_t offset);

// Packed displacements of `counts`.
std::vector<size_t> displacements(const std::vector<size_t>& counts);
// all_to_all_single's splits (rows of dim 0 per rank; empty: equal) as element counts.
std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 size_t width, const std::string& op, const std::string& what);

}  // namespace chorus::c10d_backend
