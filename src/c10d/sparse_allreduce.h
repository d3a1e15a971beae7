// allreduce (SUM) of a sparse COO tensor, as torch's gloo backend computes it, on
// chorus's collectives. DDP calls it for the gradients of nn.Embedding(sparse=True) and
// nn.EmbeddingBag(sparse=True).
//
// How: the input is coalesced; every rank allgathers a fixed-size header (nnz,
// sparse_dim, dense_dim, dtype, sizes) and checks that all ranks agree (if not, every
// rank fails alike, naming itself and a rank that differs, and nothing more is sent, so
// the group stays usable); then two allgatherv move every rank's indices and values;
// each rank adds the ranks' tensors in rank order (rank 0's plus rank 1's, plus rank
// 2's, ...) with ATen's sparse addition, which is gloo's sum: the results are gloo's
// bit for bit at every world size. The sum, coalesced, is written into the caller's
// tensor (a sparse copy_, as gloo does), which is also the work's result and its
// future's value.
//
// The header exchange and the data exchange are two stages (stages.h): the data's
// sizes are known only once the headers are in.
#pragma once

#include <atomic>
#include <exception>
#include <vector>

#include <ATen/ATen.h>

#include "c10d/stages.h"

namespace chorus::c10d_backend {

class SparseAllreduce : public TwoStageOperation {
 public:
  // Headers hold the sizes of up to kMaxDims dimensions; a tensor with more fails on
  // every rank once the headers are exchanged.
  static constexpr int64_t kMaxDims = 16;

  // Coalesces `input` (a new tensor where it was not coalesced) and fills this rank's
  // header; nothing is sent.
  SparseAllreduce(const at::Tensor& input, int rank, int size);

  void issue_first(Communicator& comm) override;
  const ::chorus::Work& headers_work() const { return headers_work_; }
  bool first_done() const override { return headers_work_.is_completed(); }
  void issue_second(Communicator& comm) noexcept override;

  // Whether every stage has been issued and has finished.
  bool done() const;
  // Waits for the data, sums it and writes the sum into `target`. Throws the failure of
  // either stage (InvalidArgumentError where the ranks disagree).
  void finish(at::Tensor& target);

 private:
  // Header fields, int64 each: nnz, sparse_dim, dense_dim, dtype, then the sizes.
  static constexpr int64_t kFields = 4 + kMaxDims;
  const int64_t* header_of(int rank) const { return headers_.data() + rank * kFields; }
  // Elements of one nonzero's value (the product of the dense sizes).
  int64_t row_numel() const { return c10::multiply_integers(input_.sizes().slice(input_.sparse_dim())); }
  void check_headers() const;
  void issue_data(Communicator& comm);
  at::Tensor summed() const;

  int rank_;
  int size_;
  at::Tensor input_;    // coalesced
  at::Tensor indices_;  // [sparse_dim, nnz], contiguous: what this rank sends
  at::Tensor values_;   // [nnz, dense sizes...], contiguous
  std::vector<int64_t> header_;
  std::vector<int64_t> headers_;  // every rank's header, in rank order
  ::chorus::Work headers_work_;
  ::chorus::Work indices_work_;
  ::chorus::Work values_work_;
  at::Tensor all_indices_;  // every rank's indices, flat, in rank order
  at::Tensor all_values_;   // every rank's values, flat, in rank order
  std::exception_ptr error_;  // of the first stage or the check, set by issue_second
  std::atomic<bool> second_issued_{false};
};

}  // namespace chorus::c10d_backend
