#include "comm/transport/transport.h"

#include <cstdio>
#include <stdexcept>
#include <string_view>

#include "chorus/types.h"

namespace chorus::transport {
namespace {

constexpr uint8_t kAllgathervCode = wire_code(Collective::kAllgatherv),
                  kAlltoallvCode = wire_code(Collective::kAlltoallv),
                  kBarrierCode = wire_code(Collective::kBarrier);

std::string dtype_text(uint8_t dtype) {
  // A byte off the wire may be anything; dtype_name() of an unknown one is "?".
  if (dtype > static_cast<uint8_t>(DataType::kInt64)) return "an unknown dtype";
  return dtype_name(static_cast<DataType>(dtype));
}

}  // namespace

const char* op_code_name(uint8_t code) {
  if (code == kConsistencyCheckCode) return "consistency check";
  if (code == wire_code(Collective::kSend)) return "send/recv";
  return collective_name(static_cast<Collective>(code));
}

uint64_t counts_digest(const size_t* counts, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t r = 0; r < n; ++r) {
    const auto c = static_cast<uint64_t>(counts[r]);
    for (int k = 0; k < 8; ++k) h = (h ^ ((c >> (8 * k)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

std::string describe_call(uint8_t code, const char* name, uint64_t seq, bool p2p,
                          const Signature& sig) {
  std::string s = name != nullptr ? name : op_code_name(code);
  if (!p2p) s += " #" + std::to_string(seq);
  if (code == kBarrierCode || code == kConsistencyCheckCode) return s;
  s += " with " + dtype_text(sig.dtype);
  if (code == kAllgathervCode) {
    char digest[24];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(sig.count));
    s += std::string(" × recv_counts of digest ") + digest;
  } else if (code != kAlltoallvCode) {
    s += " × " + std::to_string(sig.count);
  }
  if (sig.reduce != kNoReduce) {
    s += ", ";
    const bool known = sig.reduce <= static_cast<uint8_t>(ReduceOp::kAvg);
    s += known ? op_name(static_cast<ReduceOp>(sig.reduce)) : "an unknown op";
  }
  if (sig.root >= 0) s += ", root " + std::to_string(sig.root);
  if (p2p && sig.tag != 0) s += ", tag " + std::to_string(sig.tag);
  return s;
}

Arrival Transport::probe(const std::vector<int>&, std::chrono::steady_clock::time_point, bool) {
  throw std::logic_error("this transport carries no send/recv messages to probe");
}

Request Transport::irecv_message(int, void*, size_t, const Signature&) {
  throw std::logic_error("this transport carries no send/recv messages");
}

std::string probe_timeout_text(const std::string& op, const std::string& here,
                               const std::string& where, int tag,
                               const std::vector<std::string>& from) {
  std::string s = op + " timed out on " + here + " waiting" + where + " for ";
  if (from.size() > 1) s += "any of: ";
  for (size_t i = 0; i < from.size(); ++i) s += (i > 0 ? ", " : "") + from[i];
  s += " to send a message";
  if (tag != 0) s += " with tag " + std::to_string(tag);
  return s + " (the sender is stopped, hung, behind, or sends with another tag)";
}

std::string mismatch_text(const std::string& peer, int peer_rank, const std::string& theirs,
                          const std::string& mine) {
  return "mismatch with " + peer + ": rank " + std::to_string(peer_rank) + " called " + theirs +
         "; this rank called " + mine +
         " (every rank must make the same calls in the same order, with the same count, dtype, op "
         "and root)";
}

}  // namespace chorus::transport
