// The single decision point of chorus_comm: which algorithm an operation runs, from the
// forced choice (CHORUS_ALGO, CHORUS_TRANSPORT), the communicator's shape and the cost
// model's predictions and measured cut-offs (cost_model.h).
#include <string>

#include "chorus/error.h"
#include "comm/communicator/communicator_impl.h"
#include "comm/communicator/cost_model.h"

namespace chorus {
namespace internal {

bool CommunicatorImpl::hierarchical_possible() const {
  return topology_.nodes > 1 && topology_.local_size > 1 && topology_.uniform();
}

bool CommunicatorImpl::direct_path_possible() const {
  const Algorithm forced = options_.algorithm;
  return options_.shm_direct && all_in_shared_memory() && size_ > 1 &&
         (forced == Algorithm::kAuto || forced == Algorithm::kShmDirect);
}

bool CommunicatorImpl::direct_path(Collective op, const void* in, size_t in_bytes, const void* out, size_t out_bytes,
                                   transport::shm::SharedRef& in_ref,
                                   transport::shm::SharedRef& out_ref) const {
  if (!direct_path_possible()) return false;
  // First whether the buffers are node-shared: without the lock, and without the model,
  // where the process has none.
  out_ref = transport::shm::find_shared(out, out_bytes);
  if (!out_ref) return false;
  // The model knows the path (predicted_shared_us): it is taken where it is predicted
  // no slower than the segment path; with the built-in parameters from about 16 KiB
  // (below, its second phase costs more than the copies it saves).
  const size_t bytes = std::max(in_bytes, out_bytes);
  if (predicted_shared_us(op, bytes, shape_, cost_) > predicted_us(op, Algorithm::kShmDirect, bytes, shape_, cost_)) {
    return false;
  }
  in_ref = in == nullptr ? transport::shm::SharedRef{} : transport::shm::find_shared(in, in_bytes);
  return in == nullptr || static_cast<bool>(in_ref);
}

Algorithm CommunicatorImpl::algorithm_for(Collective c, size_t bytes) const {
  Algorithm forced = options_.algorithm;
  // A forced algorithm that this communicator's shape cannot run falls back to the
  // automatic choice, so that one CHORUS_ALGO serves every communicator of a job.
  if (forced == Algorithm::kHierarchical && !hierarchical_possible()) forced = Algorithm::kAuto;
  if (forced == Algorithm::kShmDirect && !all_in_shared_memory()) forced = Algorithm::kAuto;
  const bool tcp_forced = forced == Algorithm::kRing || forced == Algorithm::kRecursiveDoubling ||
                          forced == Algorithm::kHalvingDoubling;
  const bool shm = all_in_shared_memory() && !tcp_forced;
  if (c == Collective::kAllreduce) {
    if (forced != Algorithm::kAuto) return forced;
    if (size_ == 1) return Algorithm::kRecursiveDoubling;
    // The choice depends only on the size here: remembered per size (training issues
    // the same few sizes over and over), it costs a small collective nothing.
    std::atomic<uint64_t>& memo = allreduce_choice_[(bytes * 0x9E3779B97F4A7C15u) >> 60];
    const uint64_t seen = memo.load(std::memory_order_relaxed);
    if (seen != 0 && (seen >> 8) == bytes) return static_cast<Algorithm>((seen & 0xff) - 1);
    std::vector<Algorithm> candidates = {Algorithm::kRecursiveDoubling,
                                         Algorithm::kHalvingDoubling, Algorithm::kRing};
    if (all_in_shared_memory()) candidates.push_back(Algorithm::kShmDirect);
    if (hierarchical_possible()) candidates.push_back(Algorithm::kHierarchical);
    Algorithm best = cheapest(c, bytes, shape_, cost_, candidates);
    if (bytes < (uint64_t{1} << 56)) {
      memo.store(bytes << 8 | (static_cast<uint64_t>(best) + 1), std::memory_order_relaxed);
    }
    return best;
  }
  if (c == Collective::kBroadcast || c == Collective::kAllgather) {
    if (forced == Algorithm::kShmDirect || forced == Algorithm::kHierarchical) return forced;
    if (shm) return Algorithm::kShmDirect;
    if (forced == Algorithm::kAuto && hierarchical_possible()) {
      Algorithm flat = c == Collective::kBroadcast ? Algorithm::kAuto : Algorithm::kRing;
      const Algorithm candidates[] = {flat, Algorithm::kHierarchical};
      if (cheapest(c, bytes, shape_, cost_, candidates) == Algorithm::kHierarchical) {
        return Algorithm::kHierarchical;
      }
    }
    if (c == Collective::kAllgather) return Algorithm::kRing;
  }
  if (c == Collective::kBroadcast || c == Collective::kReduce) {
    if (c == Collective::kReduce && (forced == Algorithm::kShmDirect || shm)) return Algorithm::kShmDirect;
    if (forced == Algorithm::kRing) return Algorithm::kRing;
    if (forced != Algorithm::kAuto) return Algorithm::kRecursiveDoubling;  // binomial tree
    // Binomial tree while latency dominates, pipelined chain beyond (chorus-bench,
    // 2-8 ranks over loopback).
    const size_t tree_limit = cost_.tuning.tree_limit_bytes;
    return bytes <= tree_limit ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  }
  if (c == Collective::kReduceScatter || c == Collective::kBarrier) {
    if (forced == Algorithm::kShmDirect || shm) return Algorithm::kShmDirect;
    return c == Collective::kBarrier ? Algorithm::kAuto : Algorithm::kRing;
  }
  if (c == Collective::kGather || c == Collective::kScatter || c == Collective::kAlltoall || c == Collective::kAlltoallv ||
      c == Collective::kAllgatherv) {
    // Through shared memory only where the ranks read each other's buffers (their
    // direct algorithms over tcp otherwise); at every size, so that ranks that disagree
    // on the count still take the same path and fail comparing descriptors.
    // alltoallv's ranks also need their tables of counts to fit in a segment buffer.
    const bool table_fits = c != Collective::kAlltoallv || shm_ == nullptr ||
                            (1 + 3 * static_cast<size_t>(size_)) * 8 <= shm_->buffer_bytes();
    if ((forced == Algorithm::kShmDirect || shm) && shm_->cma() && table_fits) {
      return Algorithm::kShmDirect;
    }
    return c == Collective::kAllgatherv ? Algorithm::kRing : Algorithm::kAuto;
  }
  if (c == Collective::kSend || c == Collective::kRecv) {
    // A peer on this node gets its messages through shared memory (whatever
    // CHORUS_ALGO says); "shm" when every peer is on this node.
    return all_in_shared_memory() ? Algorithm::kShmDirect : Algorithm::kAuto;
  }
  return Algorithm::kAuto;  // pairwise / dissemination: no choice to make
}

}  // namespace internal

Algorithm Communicator::algorithm_for(std::string_view collective, size_t bytes) const {
  if (std::optional<Collective> c = parse_collective(collective)) return algorithm_for(*c, bytes);
  std::string names;
  for (Collective c : kAllCollectives) names += std::string(names.empty() ? "" : ", ") + collective_name(c);
  throw InvalidArgumentError("algorithm_for: unknown collective '" + std::string(collective) +
                             "' (one of " + names + ")");
}

}  // namespace chorus
