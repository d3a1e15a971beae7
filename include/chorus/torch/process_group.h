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
