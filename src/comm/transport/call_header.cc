#include "comm/transport/call_header.h"

#include <sstream>

namespace chorus::transport {

std::string call_mismatch(const CallHeader& got, size_t got_len, const CallHeader& want,
                          size_t want_len, int peer, const std::string& peer_name) {
  const bool p2p = want.kind == FrameKind::kP2P, their_p2p = got.kind == FrameKind::kP2P;
  const bool same_call = got.kind == want.kind && got.code == want.code && got.sig == want.sig &&
                         (p2p || got.seq == want.seq);
  if (!same_call) {
    return mismatch_text(
        peer_name, peer,
        describe_call(got.code, their_p2p ? got.name : nullptr, got.seq, their_p2p, got.sig),
        describe_call(want.code, p2p ? want.name : nullptr, want.seq, p2p, want.sig));
  }
  if (got_len == want_len) return "";
  std::ostringstream m;
  m << "mismatched message from " << peer_name << ": expected " << want_len << " bytes, got "
    << got_len << " bytes: the ranks issued different operations, counts or types";
  return m.str();
}

OpInfo collective_op(const char* name, uint64_t seq, DataType dtype, bool reduces, ReduceOp op,
                     uint64_t count, int root, Deadline deadline) {
  OpInfo info;
  info.name = name;
  info.code = wire_code(parse_collective(name).value());
  info.seq = seq;
  info.kind = FrameKind::kCollective;
  info.deadline = deadline;
  info.sig.count = count;
  info.sig.root = root;
  info.sig.dtype = static_cast<uint8_t>(dtype);
  if (reduces) info.sig.reduce = static_cast<uint8_t>(op);
  return info;
}

}  // namespace chorus::transport
