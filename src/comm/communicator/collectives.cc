// The issuing side of every collective: validate the arguments into a Call, then
// issue() plans it (plan.h: one decision, in plan.cc) and runs or queues it.
#include <algorithm>
#include <cstring>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/communicator_impl.h"
#include "comm/reduce/validate.h"

namespace chorus::communicator {

using algorithms::Context;
using reduce::Validator;

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

// `displs` as given, or packed one block after another where it is empty.
std::vector<size_t> displs_or_packed(std::span<const size_t> counts, std::span<const size_t> displs) {
  if (!displs.empty()) return std::vector<size_t>(displs.begin(), displs.end());
  std::vector<size_t> d(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = at;
    at += counts[i];
  }
  return d;
}

// A validated call: `bytes` for the choice, `in_bytes` and `out_bytes` the spans the
// direct path looks up (0 where the collective has none).
Call call(Collective what, const void* send, void* recv, size_t count, size_t bytes, size_t in_bytes,
          size_t out_bytes, int root = -1) {
  Call c;
  c.what = what;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.root = root;
  c.bytes = bytes;
  c.in_bytes = in_bytes;
  c.out_bytes = out_bytes;
  return c;
}

}  // namespace

Work CommunicatorImpl::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op) {
  Validator v(Collective::kAllreduce, rank_, size_);
  const size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  check_op(v, op);
  return issue(shaped(reducing(Collective::kAllreduce, dtype, op), count),
               call(Collective::kAllreduce, send, recv, count, bytes, bytes, bytes));
}

Work CommunicatorImpl::broadcast(const void* send, void* recv, size_t count, DataType dtype,
                                 int root) {
  Validator v(Collective::kBroadcast, rank_, size_);
  v.root(root);
  const size_t bytes = v.bytes(count, dtype, "count");
  if (rank_ == root) v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  return issue(shaped(spec(Collective::kBroadcast, dtype), count, root),
               call(Collective::kBroadcast, send, recv, count, bytes, bytes, bytes, root));
}

Work CommunicatorImpl::reduce(const void* send, void* recv, size_t count, DataType dtype,
                              ReduceOp op, int root) {
  Validator v(Collective::kReduce, rank_, size_);
  v.root(root);
  const size_t bytes = v.bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  if (rank_ == root) v.buffer(recv, count, "recv");
  check_op(v, op);
  return issue(shaped(reducing(Collective::kReduce, dtype, op), count, root),
               call(Collective::kReduce, send, recv, count, bytes, 0, 0, root));
}

Work CommunicatorImpl::allgather(const void* send, void* recv, size_t count, DataType dtype) {
  Validator v(Collective::kAllgather, rank_, size_);
  const size_t total_bytes = v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  return issue(shaped(spec(Collective::kAllgather, dtype), count),
               call(Collective::kAllgather, send, recv, count, total_bytes, total_bytes / size_, total_bytes));
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
  OpSpec s = shaped(spec(Collective::kAllgatherv, dtype), send_count);
  s.agreed_count = transport::counts_digest(recv_counts.data(), recv_counts.size());
  Call c = call(Collective::kAllgatherv, send, recv, send_count, 0, 0, 0);  // the same at every size
  c.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  c.recv_displs = displs_or_packed(recv_counts, displs);
  return issue(s, std::move(c));
}

Work CommunicatorImpl::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                      DataType dtype, ReduceOp op) {
  Validator v(Collective::kReduceScatter, rank_, size_);
  const size_t total_bytes = v.blocks_bytes(recv_count, dtype, "recv_count");
  v.buffer(send, recv_count * static_cast<size_t>(size_), "send");
  v.buffer(recv, recv_count, "recv");
  check_op(v, op);
  return issue(shaped(reducing(Collective::kReduceScatter, dtype, op), recv_count),
               call(Collective::kReduceScatter, send, recv, recv_count, total_bytes, total_bytes,
                    total_bytes / size_));
}

Work CommunicatorImpl::gather(const void* send, void* recv, size_t count, DataType dtype,
                              int root) {
  Validator v(Collective::kGather, rank_, size_);
  v.root(root);
  v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  if (rank_ == root) v.buffer(recv, count, "recv");
  return issue(shaped(spec(Collective::kGather, dtype), count, root),
               call(Collective::kGather, send, recv, count, count * dtype_size(dtype), 0, 0, root));
}

Work CommunicatorImpl::scatter(const void* send, void* recv, size_t count, DataType dtype,
                               int root) {
  Validator v(Collective::kScatter, rank_, size_);
  v.root(root);
  v.blocks_bytes(count, dtype, "count");
  if (rank_ == root) v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  return issue(shaped(spec(Collective::kScatter, dtype), count, root),
               call(Collective::kScatter, send, recv, count, count * dtype_size(dtype), 0, 0, root));
}

Work CommunicatorImpl::alltoall(const void* send, void* recv, size_t count, DataType dtype) {
  Validator v(Collective::kAlltoall, rank_, size_);
  const size_t total_bytes = v.blocks_bytes(count, dtype, "count");
  v.buffer(send, count, "send");
  v.buffer(recv, count, "recv");
  return issue(shaped(spec(Collective::kAlltoall, dtype), count),
               call(Collective::kAlltoall, send, recv, count, total_bytes, 0, 0));
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
  const size_t send_extent = v.extent(send_counts, send_displs);
  const size_t recv_extent = v.extent(recv_counts, recv_displs);
  v.bytes(send_extent, dtype, "send extent");
  v.bytes(recv_extent, dtype, "recv extent");
  v.buffer(send, send_extent, "send");
  v.buffer(recv, recv_extent, "recv");
  Call c = call(Collective::kAlltoallv, send, recv, 0, 0, 0, 0);  // the same at every size
  c.send_counts.assign(send_counts.begin(), send_counts.end());
  c.send_displs = displs_or_packed(send_counts, send_displs);
  c.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  c.recv_displs = displs_or_packed(recv_counts, recv_displs);
  return issue(spec(Collective::kAlltoallv, dtype), std::move(c));
}

Work CommunicatorImpl::barrier() {
  return issue(spec(Collective::kBarrier, DataType::kUInt8), call(Collective::kBarrier, nullptr, nullptr, 0, 0, 0, 0));
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

}  // namespace chorus::communicator
