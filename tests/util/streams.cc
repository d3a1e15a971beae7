#include "util/streams.h"

#include <gtest/gtest.h>

#include <vector>

#include "comm/transport/call_header.h"
#include "comm/transport/roster.h"

namespace chorus::test {

void exchange_with_every_peer(transport::Transport& t, uint64_t seq,
                              std::chrono::milliseconds timeout) {
  const int me = t.rank(), n = t.size();
  t.begin(transport::collective_op("alltoall", seq, DataType::kUInt8, false, ReduceOp::kSum, 1,
                                   -1, Deadline(timeout)));
  std::vector<uint8_t> out(static_cast<size_t>(n)), in(static_cast<size_t>(n), 0xff);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    out[p] = static_cast<uint8_t>(me * 31 + p);
    t.irecv(p, &in[p], 1);
    t.isend(p, &out[p], 1);
  }
  t.wait_all();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    EXPECT_EQ(in[p], static_cast<uint8_t>(p * 31 + me)) << "from rank " << p;
  }
}

uint16_t published_port(Store& store, int rank) {
  int size = 0;
  return transport::decode_member(store.get(transport::member_key(rank)), rank, &size).port;
}

}  // namespace chorus::test
