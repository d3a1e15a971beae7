// ProcessGroupChorus: torch.distributed's process group over chorus's communicators.
//
// Created by torch_chorus's backend creator with the store, rank, size and timeout that
// init_process_group / new_group pass; creation is collective and returns once the
// group is connected (within the connect timeout: CHORUS_CONNECT_TIMEOUT, else 120 s,
// and never longer than the group's timeout). The group's timeout, every operation's
// deadline, is `timeout` unless CHORUS_TIMEOUT (else HCCL_EXEC_TIMEOUT) is set: the
// operator's override then applies, and a `timeout` that differs is logged as
// overridden (CommOptions::from_env(timeout)).
//
// Tensors: CPU only; any layout (non-contiguous tensors are staged through a contiguous
// copy and written back); dense, except allreduce, which also sums sparse COO tensors
// (ReduceOp.SUM only) as gloo does (sparse_allreduce.h). Reductions take float32/64, float16, bfloat16, int8, uint8,
// int32, int64, complex64/128 (SUM and AVG, as pairs of reals) and bool (MIN, MAX,
// PRODUCT); every other collective moves any dtype as bytes. Ops: SUM, AVG, PRODUCT,
// MIN, MAX; the bitwise ops and PREMUL_SUM are refused naming the op. allgather's and
// reduce_scatter's lists may hold tensors of different sizes, rank r's the size of rank
// r's input (output), the same on every rank (TorchRec's unequal batches). A bad call (a
// CUDA tensor, a dtype or op chorus lacks, sizes that disagree, a list of several
// tensors per process) throws before anything is sent and leaves the group usable.
//
// Threading: torch calls these without the GIL, from any thread; operations run in
// issue order per group (point to point on their own communicators, see Comms). A
// failure during an operation (a dead or stopped peer, a timeout) is raised by wait()
// and the future, names the operation, rank and host, and breaks the group: every later
// operation fails at once. Rebuild it (destroy_process_group + init_process_group).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <atomic>

#include "c10d/stages.h"
#include "c10d/tensors.h"
#include "c10d/work.h"

namespace chorus::c10d_backend {

// torch 1.x: a backend is a ProcessGroup. torch 2.x: a Backend, which torch wraps in a
// ProcessGroup for the devices it was registered for (torch_chorus registers "cpu").
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = ::c10d::Backend;
#else
using BackendBase = ::c10d::ProcessGroup;
#endif

class ProcessGroupChorus : public BackendBase {
 public:
  ProcessGroupChorus(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  using Ptr = c10::intrusive_ptr<::c10d::Work>;
  Ptr broadcast(std::vector<at::Tensor>& tensors,
                const ::c10d::BroadcastOptions& opts = ::c10d::BroadcastOptions()) override;
  Ptr allreduce(std::vector<at::Tensor>& tensors,
                const ::c10d::AllreduceOptions& opts = ::c10d::AllreduceOptions()) override;
  Ptr allreduce_coalesced(std::vector<at::Tensor>& tensors,
                          const ::c10d::AllreduceCoalescedOptions& opts =
                              ::c10d::AllreduceCoalescedOptions()) override;
  Ptr reduce(std::vector<at::Tensor>& tensors,
             const ::c10d::ReduceOptions& opts = ::c10d::ReduceOptions()) override;
  Ptr allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  Ptr _allgather_base(at::Tensor& output, at::Tensor& input,
                      const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  Ptr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                          std::vector<at::Tensor>& inputs,
                          const ::c10d::AllgatherOptions& opts = ::c10d::AllgatherOptions()) override;
  Ptr gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
             const ::c10d::GatherOptions& opts = ::c10d::GatherOptions()) override;
  Ptr scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
              const ::c10d::ScatterOptions& opts = ::c10d::ScatterOptions()) override;
  Ptr reduce_scatter(std::vector<at::Tensor>& outputs,
                     std::vector<std::vector<at::Tensor>>& inputs,
                     const ::c10d::ReduceScatterOptions& opts =
                         ::c10d::ReduceScatterOptions()) override;
  Ptr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                           const ::c10d::ReduceScatterOptions& opts =
                               ::c10d::ReduceScatterOptions()) override;
  Ptr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                    std::vector<int64_t>& input_splits,
                    const ::c10d::AllToAllOptions& opts = ::c10d::AllToAllOptions()) override;
  Ptr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
               const ::c10d::AllToAllOptions& opts = ::c10d::AllToAllOptions()) override;
  Ptr send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  Ptr recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  Ptr recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  Ptr barrier(const ::c10d::BarrierOptions& opts = ::c10d::BarrierOptions()) override;

#if TORCH_VERSION_MAJOR >= 2
  // torch 2.x: the coalesced tensor collectives of DTensor, the functional collectives
  // and the coalescing manager (outputs[i] gathers / is reduced from inputs[i]), each
  // one chorus operation over the packed tensors.
  Ptr allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const ::c10d::AllgatherOptions& opts =
                                          ::c10d::AllgatherOptions()) override;
  Ptr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const ::c10d::ReduceScatterOptions& opts =
                                          ::c10d::ReduceScatterOptions()) override;
  // Coalescing (batch_isend_irecv, _coalescing_manager): operations issued between the
  // two run as issued; endCoalescing returns one work that completes when all have.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  Ptr endCoalescing() override;
  // abort(): every pending and later operation fails at once (the communicators are
  // aborted); shutdown() (destroy_process_group): pending operations finish, each
  // within the timeout. setTimeout() is refused unless it names the group's timeout
  // (the one that applies): the deadline is fixed when the group connects.
  void abort() override;
  void shutdown() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

  // For tests and diagnostics: the communicator the collectives run on.
  Communicator& communicator() { return *comms_->collectives; }
  // Waits until the futures asked for have completed and their callbacks have run, at
  // most the group's timeout (every operation ends by then; the callbacks are the
  // program's); returns whether they all did. Call it without the GIL: Python callbacks
  // take it. torch_chorus calls it at Python's exit (see Completer::drain).
  bool drain_callbacks();

 private:
  // `partner`: a second operation the work also waits for (a receive from any source,
  // issued on both send/recv communicators). `later_done`: of an operation issued in
  // stages (stages.h), whether its later stages have finished.
  Ptr launch(::c10d::OpType type, Work operation, std::vector<at::Tensor> outputs,
             ChorusWork::Finisher finish, std::vector<at::Tensor> keep, Work partner = {},
             ChorusWork::LaterDone later_done = nullptr);
  // The collectives communicator, once the pending stage of an earlier operation has
  // been issued (stages.h): every collective issues through it.
  Communicator& comm() { return stages_->ready(); }
  // allreduce of a sparse COO tensor (sparse_allreduce.h).
  Ptr sparse_allreduce(at::Tensor& t, const ::c10d::AllreduceOptions& opts);
  // reduce_scatter of an input list whose tensors differ in size from rank to rank.
  Ptr reduce_scatter_uneven(at::Tensor& out, std::vector<at::Tensor>& inputs,
                            const ::c10d::ReduceScatterOptions& opts);
  Communicator& p2p_to(int peer) { return *comms_->p2p[rank_ < peer ? 0 : 1]; }
  Communicator& p2p_from(int peer) { return *comms_->p2p[peer < rank_ ? 0 : 1]; }

  GroupTimeout timeout_;
  std::shared_ptr<Comms> comms_;
  std::shared_ptr<Stages> stages_;
  std::atomic<uint64_t> sequence_{0};
  std::shared_ptr<Completer> completer_;
  // Every work until its operations are done, so that the buffers they use stay alive
  // even when the caller drops the work; done ones are let go at the next launch.
  std::mutex pending_mutex_;
  std::deque<c10::intrusive_ptr<ChorusWork>> pending_;  // guarded by pending_mutex_
  // Between startCoalescing and endCoalescing: the works issued (guarded by
  // pending_mutex_; coalescing is per thread in torch, one group at a time).
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<ChorusWork>> coalesced_;
};

}  // namespace chorus::c10d_backend
