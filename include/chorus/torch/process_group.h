// chorus collectives over torch::Tensor: the role of torch.distributed's process group.
//
// Every call checks its tensors before anything is sent: CPU, contiguous (or made so:
// see each call), a dtype chorus supports (float32/64, float16, bfloat16, int8, uint8,
// int32, int64), and shapes that agree. A bad tensor throws chorus::InvalidArgumentError
// naming the collective, the argument and what was wrong. Operations are asynchronous
// and return a chorus::Work; tensors must stay alive and untouched until it completes.
// Threading and failure semantics are the communicator's (chorus/communicator.h).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "chorus/communicator.h"

namespace chorus::torch_ext {

// The chorus element type of a torch dtype, or nullopt where chorus has none.
std::optional<DataType> to_chorus_dtype(at::ScalarType type);

class ProcessGroup {
 public:
  // Over `comm` (not null), with the options it was created with.
  explicit ProcessGroup(std::shared_ptr<Communicator> comm);

  // init_process_group("env://"): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the
  // rest of the environment (CommOptions::from_env()): every operation's deadline is
  // CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT, else 30 min.
  static std::shared_ptr<ProcessGroup> from_env();
  // init_process_group("env://", timeout=...): the same with `timeout` as every
  // operation's deadline, unless CHORUS_TIMEOUT (else HCCL_EXEC_TIMEOUT) is set: the
  // operator's override then applies, and where it differs from `timeout` one warning
  // line says so (CommOptions::from_env(timeout)).
  static std::shared_ptr<ProcessGroup> from_env(std::chrono::milliseconds timeout);

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  Communicator& communicator() { return *comm_; }

  // In place on `tensor` (must be contiguous).
  Work allreduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  Work broadcast(const at::Tensor& tensor, int root);
  Work reduce(const at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);
  // output[r] = input of rank r; output.size() == size(), each shaped like input.
  Work allgather(std::vector<at::Tensor>& output, const at::Tensor& input);
  // output (shape of one block) = op over ranks of input block `rank`; input's first
  // dimension is size() times output's.
  Work reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      ReduceOp op = ReduceOp::kSum);
  // torch.distributed.all_to_all_single: rank r's input is cut along dim 0 into size()
  // blocks of rows, block j going to rank j; its output is size() blocks of rows, block
  // j coming from rank j, in rank order. input_split_sizes[j] is the rows of input sent
  // to rank j, output_split_sizes[j] the rows of output received from rank j; each, when
  // empty, is dim 0 / size() rows for every rank (dim 0 must divide evenly). Given, each
  // has size() entries, none negative, adding up to dim 0. input and output: at least one
  // dimension, contiguous, the same dtype, not overlapping; a row is everything past dim
  // 0, and its size may differ between input and output. Any of this wrong throws
  // InvalidArgumentError naming "alltoall" and the argument, before anything is sent.
  //
  // What rank a sends to b must be what b expects from a, counted in elements (rows
  // times the row's elements). The ranks compare their counts before any data moves: a
  // disagreement fails the Work on every rank with InvalidArgumentError naming both
  // ranks and both counts ("... counts disagree between ranks (rank 1 sends 6 elements
  // to rank 0, which expects 4) ..."), and leaves the group usable. Ranks that pass
  // other dtypes make different calls: every rank fails (PeerError) naming both, and
  // the communicator is broken, as for any mismatched call (chorus/communicator.h).
  // output is written once the Work completes; input may be reused then too.
  Work alltoall(const at::Tensor& output, const at::Tensor& input,
                const std::vector<int64_t>& output_split_sizes = {},
                const std::vector<int64_t>& input_split_sizes = {});
  Work barrier();
  Work send(const at::Tensor& tensor, int peer);
  Work recv(const at::Tensor& tensor, int peer);

  // The chorus element type of a tensor's dtype; throws InvalidArgumentError naming
  // `what` for unsupported ones.
  static DataType dtype_of(const at::Tensor& tensor, const char* what);

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace chorus::torch_ext
