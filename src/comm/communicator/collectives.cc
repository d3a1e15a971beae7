// The issuing side of every collective: check arguments, then queue a body that runs
// the chosen algorithm on the progress thread.
#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/communicator_impl.h"
#include "comm/reduce/validate.h"

namespace chorus::internal {

namespace alg = chorus::algorithms;
using alg::Context;

namespace {

OpSpec spec(Collective what, DataType dtype) {
  OpSpec s;
  s.what = what;
  s.dtype = dtype;
  return s;
}

OpSpec reducing(Collective what, DataType dtype, ReduceOp op) {
  OpSpec s = spec(what, dtype);
  s.op = op;
  s.reduces = true;
  return s;
}

// The shape CHORUS_DEBUG=DETAIL compares across ranks: the per-rank element count
// (alltoallv's vary by design and are checked by the collective itself) and the root.
OpSpec shaped(OpSpec s, size_t count, int root = -1) {
  s.count = count;
  s.agreed_count = count;
  s.root = root;
  return s;
}

void check_op(const Validator& v, ReduceOp op) {
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::kAvg)) v.fail("unknown reduction op");
}

std::vector<size_t> packed_displs(std::span<const size_t> counts) {
  std::vector<size_t> d(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = at;
    at += counts[i];
  }
  return d;
}

}  // namespace

Work CommunicatorImpl::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op) {
  Validator v(Collective::kAllreduce, rank_, size_);
  size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  check_op(v, op);
  Algorithm algo = algorithm_for(Collective::kAllreduce, bytes);
  transport::shm::SharedRef in, out;
  if (direct_path(Collective::kAllreduce, send, bytes, recv, bytes, in, out)) {
    const OpSpec s = shaped(reducing(Collective::kAllreduce, dtype, op), count);
    if (std::optional<Work> w = shared_allreduce_inline(in, out, count, s)) return std::move(*w);
    return enqueue(s, [=](const Context& ctx) {
      alg::shared_allreduce(ctx, *ctx.node, in, out, count, ctx.average);
    });
  }
  const OpSpec s = shaped(reducing(Collective::kAllreduce, dtype, op), count);
  if (algo == Algorithm::kShmDirect) {
    if (std::optional<Work> w = allreduce_inline(send, recv, count, s)) return std::move(*w);
  }
  return enqueue(s, [=](const Context& ctx) {
    switch (algo) {
      case Algorithm::kRing: return alg::allreduce_ring(ctx, send, recv, count);
      case Algorithm::kHalvingDoubling:
        return alg::allreduce_halving_doubling(ctx, send, recv, count);
      case Algorithm::kHierarchical:
        return alg::allreduce_hierarchical(ctx, send, recv, count);
      case Algorithm::kShmDirect:
        return alg::shm_allreduce(ctx, *ctx.node, send, recv, count, ctx.average);
      default: return alg::allreduce_recursive_doubling(ctx, send, recv, count);
    }
  });
}

Work CommunicatorImpl::broadcast(const void* send, void* recv, size_t count, DataType dtype,
                                 int root) {
  Validator v(Collective::kBroadcast, rank_, size_);
  v.root(root);
  size_t bytes = v.bytes(count, dtype, "count");
  if (rank_ == root) v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  Algorithm algo = algorithm_for(Collective::kBroadcast, bytes);
  transport::shm::SharedRef in, out;
  if (direct_path(Collective::kBroadcast, rank_ == root ? send : nullptr, bytes, recv, bytes, in, out)) {
    return enqueue(shaped(spec(Collective::kBroadcast, dtype), count, root), [=](const Context& ctx) {
      alg::shared_broadcast(ctx, *ctx.node, in, out, count, root);
    });
  }
  return enqueue(shaped(spec(Collective::kBroadcast, dtype), count, root), [=](const Context& ctx) {
    // Shared memory reads the root's `send` itself and copies it to `recv` while the
    // other ranks take their copies.
    if (algo == Algorithm::kShmDirect) {
      return alg::shm_broadcast(ctx, *ctx.node, send, recv, count, root);
    }
    if (ctx.rank == root && send != recv && bytes > 0) std::memcpy(recv, send, bytes);
    if (algo == Algorithm::kHierarchical) alg::broadcast_hierarchical(ctx, recv, count, root);
    else if (algo == Algorithm::kRing) alg::broadcast_chain(ctx, recv, count, root);
    else alg::broadcast_binomial(ctx, recv, count, root);
  });
}

Work CommunicatorImpl::reduce(const void* send, void* recv, size_t count, DataType dtype,
                              ReduceOp op, int root) {
  Validator v(Collective::kReduce, rank_, size_);
  v.root(root);
  size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  if (rank_ == root) v.buffer(recv, count, "recv");
  check_op(v, op);
  Algorithm algo = algorithm_for(Collective::kReduce, bytes);
  return enqueue(shaped(reducing(Collective::kReduce, dtype, op), count, root), [=](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) alg::shm_reduce(ctx, *ctx.node, send, recv, count, root);
    else if (algo == Algorithm::kRing) alg::reduce_ring(ctx, send, recv, count, root);
    else alg::reduce_binomial(ctx, send, recv, count, root);
  });
}

Work CommunicatorImpl::allgather(const void* send, void* recv, size_t count, DataType dtype) {
  Validator v(Collective::kAllgather, rank_, size_);
  size_t total_bytes = v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  Algorithm algo = algorithm_for(Collective::kAllgather, total_bytes);
  transport::shm::SharedRef in, out;
  if (direct_path(Collective::kAllgather, send, total_bytes / size_, recv, total_bytes, in, out)) {
    return enqueue(shaped(spec(Collective::kAllgather, dtype), count), [=](const Context& ctx) {
      alg::shared_allgather(ctx, *ctx.node, in, out, count);
    });
  }
  return enqueue(shaped(spec(Collective::kAllgather, dtype), count), [=, this](const Context& ctx) {
    if (algo == Algorithm::kHierarchical) return alg::allgather_hierarchical(ctx, send, recv, count);
    if (algo == Algorithm::kShmDirect) {
      return alg::shm_allgather_blocks(ctx, *ctx.node, send, recv, count * size_);
    }
    std::vector<size_t> counts(size_, count), displs(size_);
    for (int r = 0; r < size_; ++r) displs[r] = static_cast<size_t>(r) * count;
    alg::allgatherv_ring(ctx, send, recv, counts, displs);
  });
}

Work CommunicatorImpl::allgatherv(const void* send, size_t send_count, void* recv,
                                  std::span<const size_t> recv_counts,
                                  std::span<const size_t> displs, DataType dtype) {
  Validator v(Collective::kAllgatherv, rank_, size_);
  v.counts(recv_counts, "recv_counts");
  v.displs(recv_counts, displs, dtype, "displs");
  v.bytes(v.extent(recv_counts, displs), dtype, "recv extent");
  v.bytes(send_count, dtype, "send_count");
  if (send_count != recv_counts[rank_]) {
    v.fail("send_count " + std::to_string(send_count) + " differs from recv_counts[" +
           std::to_string(rank_) + "] = " + std::to_string(recv_counts[rank_]));
  }
  v.buffer(send, send_count, "send");
  v.buffer(recv, v.extent(recv_counts, displs), "recv");
  std::vector<size_t> counts(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> offsets =
      displs.empty() ? packed_displs(recv_counts) : std::vector<size_t>(displs.begin(), displs.end());
  Algorithm algo = algorithm_for(Collective::kAllgatherv, 0);  // the same at every size
  OpSpec s = shaped(spec(Collective::kAllgatherv, dtype), send_count);
  s.agreed_count = transport::counts_digest(recv_counts.data(), recv_counts.size());
  return enqueue(s, [=](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) {
      return alg::shm_allgatherv(ctx, *ctx.node, send, recv, counts, offsets);
    }
    alg::allgatherv_ring(ctx, send, recv, counts, offsets);
  });
}

Work CommunicatorImpl::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                      DataType dtype, ReduceOp op) {
  Validator v(Collective::kReduceScatter, rank_, size_);
  size_t total_bytes = v.blocks_bytes(recv_count, dtype, "recv_count");
  size_t total = recv_count * static_cast<size_t>(size_);
  v.buffer(send, total, "send");
  v.buffer(recv, recv_count, "recv");
  check_op(v, op);
  Algorithm algo = algorithm_for(Collective::kReduceScatter, total_bytes);
  transport::shm::SharedRef in, out;
  if (direct_path(Collective::kReduceScatter, send, total_bytes, recv, total_bytes / size_, in, out)) {
    return enqueue(shaped(reducing(Collective::kReduceScatter, dtype, op), recv_count),
                   [=](const Context& ctx) {
                     alg::shared_reduce_scatter(ctx, *ctx.node, in, out, recv_count, ctx.average);
                   });
  }
  return enqueue(shaped(reducing(Collective::kReduceScatter, dtype, op), recv_count), [=](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) {
      return alg::shm_reduce_scatter_blocks(ctx, *ctx.node, send, recv, total, ctx.average);
    }
    alg::reduce_scatter_ring(ctx, send, recv, recv_count);
  });
}

Work CommunicatorImpl::gather(const void* send, void* recv, size_t count, DataType dtype,
                              int root) {
  Validator v(Collective::kGather, rank_, size_);
  v.root(root);
  v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  if (rank_ == root) v.buffer(recv, count, "recv");
  Algorithm algo = algorithm_for(Collective::kGather, count * dtype_size(dtype));
  return enqueue(shaped(spec(Collective::kGather, dtype), count, root), [=](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) return alg::shm_gather(ctx, *ctx.node, send, recv, count, root);
    alg::gather_direct(ctx, send, recv, count, root);
  });
}

Work CommunicatorImpl::scatter(const void* send, void* recv, size_t count, DataType dtype,
                               int root) {
  Validator v(Collective::kScatter, rank_, size_);
  v.root(root);
  v.blocks_bytes(count, dtype, "count");
  if (rank_ == root) v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  Algorithm algo = algorithm_for(Collective::kScatter, count * dtype_size(dtype));
  return enqueue(shaped(spec(Collective::kScatter, dtype), count, root), [=](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) return alg::shm_scatter(ctx, *ctx.node, send, recv, count, root);
    alg::scatter_direct(ctx, send, recv, count, root);
  });
}

Work CommunicatorImpl::alltoall(const void* send, void* recv, size_t count, DataType dtype) {
  Validator v(Collective::kAlltoall, rank_, size_);
  size_t total_bytes = v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  Algorithm algo = algorithm_for(Collective::kAlltoall, total_bytes);
  return enqueue(shaped(spec(Collective::kAlltoall, dtype), count), [=, this](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) return alg::shm_alltoall(ctx, *ctx.node, send, recv, count);
    std::vector<size_t> counts(size_, count), displs(size_);
    for (int r = 0; r < size_; ++r) displs[r] = static_cast<size_t>(r) * count;
    const void* src = send;
    if (send == recv && total_bytes > 0) {  // in place: keep a copy of what goes out
      uint8_t* copy = ctx.scratch.get(total_bytes, 1);
      std::memcpy(copy, send, total_bytes);
      src = copy;
    }
    alg::alltoallv_pairwise(ctx, src, counts, displs, recv, counts, displs);
  });
}

Work CommunicatorImpl::alltoallv(const void* send, std::span<const size_t> send_counts,
                                 std::span<const size_t> send_displs, void* recv,
                                 std::span<const size_t> recv_counts,
                                 std::span<const size_t> recv_displs, DataType dtype) {
  Validator v(Collective::kAlltoallv, rank_, size_);
  v.counts(send_counts, "send_counts");
  v.counts(recv_counts, "recv_counts");
  v.displs(send_counts, send_displs, dtype, "send_displs");
  v.displs(recv_counts, recv_displs, dtype, "recv_displs");
  size_t send_extent = v.extent(send_counts, send_displs);
  size_t recv_extent = v.extent(recv_counts, recv_displs);
  size_t send_bytes = v.bytes(send_extent, dtype, "send extent");
  v.bytes(recv_extent, dtype, "recv extent");
  v.buffer(send, send_extent, "send");
  v.buffer(recv, recv_extent, "recv");
  std::vector<size_t> sc(send_counts.begin(), send_counts.end());
  std::vector<size_t> rc(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> sd = send_displs.empty() ? packed_displs(send_counts)
                                               : std::vector<size_t>(send_displs.begin(), send_displs.end());
  std::vector<size_t> rd = recv_displs.empty() ? packed_displs(recv_counts)
                                               : std::vector<size_t>(recv_displs.begin(), recv_displs.end());
  Algorithm algo = algorithm_for(Collective::kAlltoallv, 0);  // the same at every size
  return enqueue(spec(Collective::kAlltoallv, dtype), [=, this](const Context& ctx) {
    // Every rank learns what each peer will send it and checks it against what it
    // expects; then all agree on the verdict, so that a mismatch fails everywhere
    // before any data moves.
    std::string local;
    auto verdict = [&](const std::vector<uint64_t>& announced) -> int32_t {
      for (int p = 0; p < size_; ++p) {
        if (announced[p] == rc[p]) continue;
        local = "rank " + std::to_string(p) + " sends " + std::to_string(announced[p]) +
                " elements to rank " + std::to_string(rank_) + ", which expects " +
                std::to_string(rc[p]);
        return rank_;
      }
      return INT32_MAX;
    };
    auto fail = [&](int32_t first_bad) {
      throw InvalidArgumentError(
          "alltoallv on rank " + std::to_string(rank_) + ": counts disagree between ranks (" +
          (local.empty() ? "found by rank " + std::to_string(first_bad) : local) +
          "); no data was sent");
    };
    if (algo == Algorithm::kShmDirect) {
      int32_t first_bad = alg::shm_alltoallv(ctx, *ctx.node, send, sc, sd, recv, rc, rd, verdict);
      if (first_bad != INT32_MAX) fail(first_bad);
      return;
    }
    std::vector<size_t> ones(size_, 1), iota(size_);
    std::iota(iota.begin(), iota.end(), 0);
    std::vector<uint64_t> announced(size_);
    Context meta = ctx;
    meta.elem = sizeof(uint64_t);
    alg::alltoallv_pairwise(meta, sc.data(), ones, iota, announced.data(), ones, iota);
    int32_t first_bad = verdict(announced);
    Context agree = ctx;
    agree.dtype = DataType::kInt32;
    agree.elem = 4;
    agree.reduce = reduce_function(DataType::kInt32, ReduceOp::kMin);
    agree.reduce_many = nullptr;
    agree.average = false;
    alg::allreduce_recursive_doubling(agree, &first_bad, &first_bad, 1);
    if (first_bad != INT32_MAX) fail(first_bad);
    const void* src = send;
    if (send == recv && send_bytes > 0) {
      uint8_t* copy = ctx.scratch.get(send_bytes, 1);
      std::memcpy(copy, send, send_bytes);
      src = copy;
    }
    alg::alltoallv_pairwise(ctx, src, sc, sd, recv, rc, rd);
  });
}

Work CommunicatorImpl::barrier() {
  Algorithm algo = algorithm_for(Collective::kBarrier, 0);
  return enqueue(spec(Collective::kBarrier, DataType::kUInt8), [algo](const Context& ctx) {
    if (algo == Algorithm::kShmDirect) return alg::shm_barrier(ctx, *ctx.node);
    alg::barrier_dissemination(ctx);
  });
}

Work CommunicatorImpl::send(const void* buf, size_t count, DataType dtype, int peer, int tag) {
  Validator v(Collective::kSend, rank_, size_);
  v.peer(peer);
  size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(buf, count, "send");
  OpSpec s = shaped(spec(Collective::kSend, dtype), count, peer);  // the flight recorder's count and peer
  s.tag = tag;
  return enqueue(s, [=](const Context& ctx) {
    // The transport routes: a peer on this node through shared memory, others over tcp.
    ctx.transport.wait(ctx.transport.isend(peer, buf, bytes));
  });
}

Work CommunicatorImpl::recv(void* buf, size_t count, DataType dtype, int peer, int tag) {
  Validator v(Collective::kRecv, rank_, size_);
  v.peer(peer);
  size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(buf, count, "recv");
  OpSpec s = shaped(spec(Collective::kRecv, dtype), count, peer);  // the flight recorder's count and peer
  s.tag = tag;
  s.source = std::make_shared<std::atomic<int>>(-1);
  const transport::Signature mine = signature_of(s);
  return enqueue(s, [=, this, source = s.source](const Context& ctx) {
    receive_matching(ctx.transport, buf, bytes, {peer}, mine, nullptr, *source);
  });
}

Work CommunicatorImpl::recv_any(void* buf, size_t count, DataType dtype, int tag,
                                std::vector<int> sources, std::shared_ptr<RecvClaim> claim) {
  Validator v(Collective::kRecv, rank_, size_);
  if (sources.empty()) {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) sources.push_back(r);
    }
    if (sources.empty()) v.fail("a receive from any source needs another rank (world size 1)");
  }
  std::sort(sources.begin(), sources.end());
  for (size_t i = 0; i < sources.size(); ++i) {
    v.peer(sources[i]);
    if (i > 0 && sources[i] == sources[i - 1]) {
      v.fail("sources names rank " + std::to_string(sources[i]) + " twice");
    }
  }
  size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(buf, count, "recv");
  OpSpec s = shaped(spec(Collective::kRecv, dtype), count, -1);
  s.tag = tag;
  s.source = std::make_shared<std::atomic<int>>(-1);
  const transport::Signature mine = signature_of(s);
  return enqueue(s, [=, this, source = s.source](const Context& ctx) {
    receive_matching(ctx.transport, buf, bytes, sources, mine, claim.get(), *source);
  });
}

}  // namespace chorus::internal
