#include "c10d/sparse_allreduce.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>

#include "c10d/tensors.h"
#include "chorus/error.h"

namespace chorus::c10d_backend {

namespace {

enum Field : int64_t { kNnz, kSparseDim, kDenseDim, kDtype, kSizes };

int64_t dims_of(const int64_t* header) { return header[kSparseDim] + header[kDenseDim]; }

// "Float[1000, 16] (sparse_dim 1, dense_dim 1)", from a header.
std::string describe_header(const int64_t* header, int64_t max_dims) {
  const int64_t code = header[kDtype];
  std::string s = code >= 0 && code < static_cast<int64_t>(at::ScalarType::NumOptions)
                      ? c10::toString(static_cast<at::ScalarType>(code))
                      : "dtype #" + std::to_string(code);
  s += "[";
  const int64_t shown = std::min(dims_of(header), max_dims);
  for (int64_t d = 0; d < shown; ++d) s += (d ? ", " : "") + std::to_string(header[kSizes + d]);
  if (dims_of(header) > shown) s += ", ...";
  return s + "] (sparse_dim " + std::to_string(header[kSparseDim]) + ", dense_dim " +
         std::to_string(header[kDenseDim]) + ")";
}

// Element counts of the ranks' blocks of a flat exchange, `per_row` per nonzero.
std::vector<size_t> block_counts(const std::vector<int64_t>& nnz, int64_t per_row, size_t width) {
  std::vector<size_t> counts(nnz.size());
  for (size_t r = 0; r < nnz.size(); ++r) counts[r] = static_cast<size_t>(nnz[r] * per_row) * width;
  return counts;
}

size_t total(const std::vector<size_t>& counts) {
  size_t sum = 0;
  for (size_t c : counts) sum += c;
  return sum;
}

}  // namespace

SparseAllreduce::SparseAllreduce(const at::Tensor& input, int rank, int size)
    : rank_(rank), size_(size), input_(input.coalesce()) {
  indices_ = input_._indices().contiguous();
  values_ = input_._values().contiguous();
  header_.assign(kFields, 0);
  header_[kNnz] = input_._nnz();
  header_[kSparseDim] = input_.sparse_dim();
  header_[kDenseDim] = input_.dense_dim();
  header_[kDtype] = static_cast<int64_t>(input_.scalar_type());
  for (int64_t d = 0; d < std::min(input_.dim(), kMaxDims); ++d) header_[kSizes + d] = input_.size(d);
  headers_.assign(static_cast<size_t>(size) * kFields, 0);
}

void SparseAllreduce::issue_first(Communicator& comm) {
  headers_work_ = comm.allgather(header_.data(), headers_.data(), kFields, DataType::kInt64);
}

// Every rank compares every header with its own, so every rank finds a disagreement
// that any rank would, and all of them skip the data exchange.
void SparseAllreduce::check_headers() const {
  const int64_t* mine = header_of(rank_);
  for (int r = 0; r < size_; ++r) {
    const int64_t* theirs = header_of(r);
    if (dims_of(theirs) > kMaxDims) {
      refuse("allreduce", "rank " + std::to_string(r) + "'s sparse tensor " +
                              describe_header(theirs, kMaxDims) + " has " +
                              std::to_string(dims_of(theirs)) +
                              " dimensions; chorus reduces sparse tensors of at most " +
                              std::to_string(kMaxDims));
    }
    if (!std::equal(mine + kSparseDim, mine + kFields, theirs + kSparseDim)) {
      refuse("allreduce", "the ranks' sparse tensors disagree: this rank (rank " +
                              std::to_string(rank_) + ") has " + describe_header(mine, kMaxDims) +
                              " but rank " + std::to_string(r) + " has " +
                              describe_header(theirs, kMaxDims) +
                              "; every rank must pass the same sizes, sparse_dim, dense_dim "
                              "and dtype (nnz may differ)");
    }
  }
}

void SparseAllreduce::issue_data(Communicator& comm) {
  std::vector<int64_t> nnz(size_);
  for (int r = 0; r < size_; ++r) nnz[r] = header_of(r)[kNnz];
  std::vector<size_t> index_counts = block_counts(nnz, input_.sparse_dim(), 1);
  all_indices_ = at::empty({static_cast<int64_t>(total(index_counts))}, indices_.options());
  const Moved m = moved_of(values_);
  std::vector<size_t> value_counts = block_counts(nnz, row_numel(), m.width);
  all_values_ = at::empty({static_cast<int64_t>(total(value_counts) / m.width)}, values_.options());
  // Every rank knows every count: an exchange of nothing is skipped on all alike.
  if (all_indices_.numel() > 0) {
    indices_work_ = comm.allgatherv(indices_.data_ptr(), index_counts[rank_], all_indices_.data_ptr(),
                                    index_counts, {}, DataType::kInt64);
  }
  if (all_values_.numel() > 0) {
    values_work_ = comm.allgatherv(values_.data_ptr(), value_counts[rank_], all_values_.data_ptr(),
                                   value_counts, {}, m.dtype);
  }
}

void SparseAllreduce::issue_second(Communicator& comm) noexcept {
  try {
    headers_work_.wait();
    check_headers();
    issue_data(comm);
  } catch (...) {
    error_ = std::current_exception();
  }
  second_issued_.store(true, std::memory_order_release);
}

bool SparseAllreduce::done() const {
  return second_issued_.load(std::memory_order_acquire) && indices_work_.is_completed() &&
         values_work_.is_completed();
}

// The ranks' tensors added in rank order, each marked coalesced (each rank sent its
// coalesced input), so that every addition merges two sorted lists: ATen's sparse
// addition computes what gloo's does, rank 0 + rank 1 + ..., in the same order.
at::Tensor SparseAllreduce::summed() const {
  at::AutoDispatchBelowAutograd below_autograd;
  const int64_t sparse_dim = input_.sparse_dim();
  const std::vector<int64_t> value_shape(input_.sizes().begin() + sparse_dim, input_.sizes().end());
  at::Tensor sum;
  int64_t index_offset = 0, value_offset = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t nnz = header_of(r)[kNnz];
    std::vector<int64_t> shape{nnz};
    shape.insert(shape.end(), value_shape.begin(), value_shape.end());
    at::Tensor indices = all_indices_.narrow(0, index_offset, nnz * sparse_dim).view({sparse_dim, nnz});
    at::Tensor values = all_values_.narrow(0, value_offset, nnz * row_numel()).view(shape);
    index_offset += nnz * sparse_dim;
    value_offset += nnz * row_numel();
    at::Tensor part = at::_sparse_coo_tensor_unsafe(indices, values, input_.sizes(), input_.options());
    part._coalesced_(true);
    sum = r == 0 ? part : sum.add(part);
  }
  return sum.coalesce();
}

void SparseAllreduce::finish(at::Tensor& target) {
  if (!second_issued_.load(std::memory_order_acquire)) {
    throw std::logic_error("chorus allreduce: the sparse data exchange was never issued");
  }
  if (error_) std::rethrow_exception(error_);
  indices_work_.wait();
  values_work_.wait();
  at::Tensor sum;
  try {
    sum = summed();
  } catch (const c10::Error& e) {
    // ATen lacks the addition for some dtypes (float16 in torch 1.13), as gloo finds.
    refuse("allreduce", std::string("summing the ranks' sparse tensors failed: ") +
                            e.what_without_backtrace());
  }
  target.copy_(sum);
}

}  // namespace chorus::c10d_backend
