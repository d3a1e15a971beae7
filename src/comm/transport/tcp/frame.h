// The header in front of every message on a TCP stream. Fixed 64 bytes, host byte
// order (chorus ranks of one job share an architecture: the handshake checks it).
//
// Besides what matches a frame to a receive (kind, operation, sequence number, length)
// it carries the signature of the sender's call (transport.h: dtype, reduction, root,
// count), which the receiver compares with its own: ranks that pass the same number of
// bytes under another dtype, op or root fail naming both calls instead of exchanging
// bytes that mean something else to each.
//
// 64 bytes, one cache line, rather than the 32 the fields need: a payload that is a
// multiple of 64 bytes then starts on a line boundary of the stream, so the kernel's
// copies into and out of its socket buffers stay aligned. Allreduce of 1 MiB (f32) over
// loopback on a 2-core AMD EPYC, best of 10-12 runs, in two rounds: 2 ranks 1311 and
// 1106 us with the old 16-byte header, 1342 and 1478 us with 32 bytes, 752 and 718 us
// with 64; 4 ranks 3557 and 4317 us, 3818 and 4552 us, 3269 and 3967 us.
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
  uint8_t op = 0;  // wire_code() of the operation that sent it
  // Collective and waiting frames: the low 32 bits of the operation's sequence number;
  // send/recv: the message's number on its stream.
  uint32_t seq = 0;
  uint64_t length = 0;  // payload bytes
  // The sender's call (Signature); unset (the defaults) in abort and goodbye frames.
  uint64_t count = 0;
  int32_t root = -1;
  uint8_t dtype = kNoDtype;
  uint8_t reduce = kNoReduce;
  uint8_t reserved0[2] = {};
  int32_t tag = 0;            // send/recv: the message's tag
  uint8_t reserved[28] = {};  // zero; pads the header to one cache line (see above)

  Signature signature() const { return Signature{count, root, dtype, reduce, tag}; }
  void set_signature(const Signature& s) {
    count = s.count;
    root = s.root;
    dtype = s.dtype;
    reduce = s.reduce;
    tag = s.tag;
  }
};
static_assert(sizeof(FrameHeader) == 64);

inline const char* frame_kind_name(uint8_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kCollective: return "collective";
    case FrameKind::kP2P: return "send/recv";
    case FrameKind::kAbort: return "abort";
    case FrameKind::kGoodbye: return "goodbye";
    case FrameKind::kWaiting: return "waiting";
  }
  return "unknown";
}

}  // namespace chorus::transport::tcp
