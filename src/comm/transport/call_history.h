// The collective calls a rank made lately, so that a transport that receives a message
// naming another call (by its sequence number) can say which call this rank made under
// that number: "rank 0 called broadcast #7 with f32 × 10, root 1; this rank called
// broadcast #7 with f32 × 10, root 0". Both transports keep one (tcp/, shm/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/transport/transport.h"

namespace chorus::transport {

// A collective call this rank made.
struct Call {
  uint64_t seq = UINT64_MAX;  // UINT64_MAX: none
  uint8_t code = 0;
  Signature sig;
};

class CallHistory {
 public:
  // Calls remembered for messages that arrive after this rank has moved on (a rank that
  // completed a broadcast as a leaf, then reads a message that the broadcast's other
  // root sent it): far more than ranks drift apart, which a peer's messages bound.
  static constexpr size_t kCalls = 64;

  // Remembers `op` when it is a collective call.
  void record(const OpInfo& op) {
    if (op.kind != FrameKind::kCollective) return;
    calls_[op.seq % kCalls] = Call{op.seq, op.code, op.sig};
    last_ = op.seq;
  }
  // The call whose sequence number ends in `seq` (messages may carry only the low 32
  // bits), when this rank made it and still remembers it; null otherwise.
  const Call* of(uint32_t seq) const {
    if (last_ == UINT64_MAX) return nullptr;
    const auto behind = static_cast<int32_t>(static_cast<uint32_t>(last_) - seq);
    // Not made yet (or before the first call).
    if (behind < 0 || static_cast<uint64_t>(behind) > last_) return nullptr;
    const uint64_t full = last_ - static_cast<uint64_t>(behind);
    const Call& c = calls_[full % kCalls];
    return c.seq == full ? &c : nullptr;
  }

 private:
  Call calls_[kCalls];
  uint64_t last_ = UINT64_MAX;  // sequence number of the latest collective recorded
};

}  // namespace chorus::transport
