// The header in front of every message on a TCP stream. Fixed 16 bytes, host byte
// order (chorus ranks of one job share an architecture: the handshake checks it).
#pragma once

#include <cstdint>

#include "comm/transport/transport.h"

namespace chorus::transport::tcp {

inline constexpr uint16_t kFrameMagic = 0xC0D5;
// Abort and goodbye frames carry at most this much text.
inline constexpr uint64_t kMaxControlPayload = 4096;

struct FrameHeader {
  uint16_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t op = 0;  // op_code_of() of the operation that sent it
  uint32_t seq = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 16);

inline const char* frame_kind_name(uint8_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kCollective: return "collective";
    case FrameKind::kP2P: return "send/recv";
    case FrameKind::kAbort: return "abort";
    case FrameKind::kGoodbye: return "goodbye";
  }
  return "unknown";
}

}  // namespace chorus::transport::tcp
