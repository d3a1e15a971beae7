// What a message of an in-memory transport (test::FakeHub, the simulator's
// sim::Engine) carries besides its bytes: the call it belongs to, as the tcp frame
// header and the shared-memory descriptor carry it; the check its receiver makes; and
// the OpInfo with which the programs that drive the algorithms over such a transport,
// without a communicator, begin a collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/transport/transport.h"

namespace chorus::transport {

struct CallHeader {
  FrameKind kind = FrameKind::kCollective;
  uint8_t code = 0;
  uint64_t seq = 0;
  const char* name = "";
  Signature sig;

  static CallHeader of(const OpInfo& op) { return {op.kind, op.code, op.seq, op.name, op.sig}; }
};

// Empty when a receive of `want_len` bytes posted in call `want` may take the message of
// `got_len` bytes that `peer` (named `peer_name`: "rank 1 (host h)") sent in call `got`;
// else the error, the part after "<op> #<seq> failed on <this rank>: " (mismatch_text(),
// or the two lengths).
std::string call_mismatch(const CallHeader& got, size_t got_len, const CallHeader& want,
                          size_t want_len, int peer, const std::string& peer_name);

// Collective `name` (a collective_name()) number `seq`, as a communicator begins it:
// every rank passes `count`, `root` and `dtype`, and `op` where the call reduces.
OpInfo collective_op(const char* name, uint64_t seq, DataType dtype, bool reduces, ReduceOp op,
                     uint64_t count, int root, Deadline deadline);

}  // namespace chorus::transport
