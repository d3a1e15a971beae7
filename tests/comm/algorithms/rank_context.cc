#include "rank_context.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "comm/reduce/reduce.h"
#include "comm/transport/call_header.h"
#include "util/ranks.h"

namespace chorus::test {

namespace {

Topology one_node(int rank, int size) {
  Topology t;
  t.local_rank = rank;
  t.local_size = size;
  t.node_of.assign(size, 0);
  t.node_ranks.resize(1);
  for (int r = 0; r < size; ++r) t.node_ranks[0].push_back(r);
  return t;
}

}  // namespace

RankContext::RankContext(transport::Transport& t, Topology topology)
    : t_(t), topology_(std::move(topology)) {}

RankContext::RankContext(transport::Transport& t) : RankContext(t, one_node(t.rank(), t.size())) {}

algorithms::Context RankContext::begin(const char* name, DataType dtype, bool reduces,
                                       ReduceOp op, uint64_t count, int root,
                                       size_t segment_bytes) {
  t_.begin(transport::collective_op(name, ++seq_, dtype, reduces, op, count, root,
                                    Deadline(kOperationTimeout)));
  algorithms::Context ctx{t_,
                          t_.rank(),
                          t_.size(),
                          dtype,
                          dtype_size(dtype),
                          reduces ? reduce_function(dtype, op) : nullptr,
                          reduces && op == ReduceOp::kAvg,
                          scratch_,
                          segment_bytes,
                          topology_,
                          op,
                          nullptr,
                          nullptr,
                          *tuning_};
  if (reduces) ctx.reduce_many = reduce_many_function(dtype, op);
  return ctx;
}

void run_ranks(FakeHub& hub, const std::function<void(FakeTransport&)>& body) {
  auto errors = run_threads(
      hub.size(), [&](int rank) { body(hub.transport(rank)); }, std::chrono::seconds(300),
      [&](int rank) { hub.transport(rank).abort("test: this rank failed"); });
  rethrow_rank_failures(errors);
}

bool quick_sweep() {
  const char* s = std::getenv("CHORUS_SWEEP");
  return s != nullptr && std::strcmp(s, "quick") == 0;
}

}  // namespace chorus::test
