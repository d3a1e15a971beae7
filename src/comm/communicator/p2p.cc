// Matching receives to messages by sender and tag (CommunicatorImpl::receive_matching),
// on the runner. The transport's streams are ordered and carry each message's tag in
// its header: a receive looks at the next message of the peers it may take from
// (Transport::probe, which consumes nothing), takes it when the tag is its own, and
// otherwise reads it whole into held_, where a later receive with that tag finds it
// first. Holding keeps the order of each (sender, tag): a peer's messages leave its
// stream in the order sent, and held_ keeps them in that order.
#include <algorithm>
#include <cstring>

#include "chorus/error.h"
#include "comm/communicator/communicator_impl.h"

namespace chorus::communicator {
namespace {

using Clock = std::chrono::steady_clock;

// A receive that shares a claim with receives on other communicators looks in slices,
// so that it notices promptly when another took the message: short at first (a message
// that is about to arrive), longer while nothing comes.
constexpr auto kFirstSlice = std::chrono::microseconds(100);
constexpr auto kLongestSlice = std::chrono::milliseconds(5);

}  // namespace

void CommunicatorImpl::hold(transport::Transport& t, const transport::Arrival& a) {
  if (a.length > kMaxHeldBytes - std::min(held_bytes_, kMaxHeldBytes)) {
    throw PeerError("recv on " + where() + ": rank " + std::to_string(a.peer) + " (host " +
                    hosts_[a.peer] + ") sent a message of " + std::to_string(a.length) +
                    " bytes with tag " + std::to_string(a.sig.tag) +
                    " before any receive asked for it, and the messages held for their "
                    "receives already take " + std::to_string(held_bytes_) + " bytes (at most " +
                    std::to_string(kMaxHeldBytes) + "); receive in the order the peers send");
  }
  HeldMessage m{a.peer, a.sig, std::vector<uint8_t>(a.length)};
  t.wait(t.irecv_message(a.peer, m.bytes.data(), a.length, a.sig));
  held_bytes_ += a.length;
  held_.push_back(std::move(m));
}

void CommunicatorImpl::receive_matching(transport::Transport& t, void* buf, size_t bytes,
                                        const std::vector<int>& sources,
                                        const transport::Signature& mine, RecvClaim* claim,
                                        std::atomic<int>& source) {
  // A held message first, the oldest.
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->sig.tag != mine.tag ||
        !std::binary_search(sources.begin(), sources.end(), it->peer)) {
      continue;
    }
    if (claim != nullptr && !claim->try_take()) return;
    if (it->sig != mine || it->bytes.size() != bytes) {
      const std::string peer = "rank " + std::to_string(it->peer) + " (host " + hosts_[it->peer] + ")";
      throw PeerError(
          "recv on " + where() + ": " +
          transport::mismatch_text(peer, it->peer,
                                   transport::describe_call(transport::wire_code(Collective::kSend),
                                                            "send", 0, true, it->sig),
                                   transport::describe_call(transport::wire_code(Collective::kSend),
                                                            "recv", 0, true, mine)));
    }
    if (bytes > 0) std::memcpy(buf, it->bytes.data(), bytes);
    source.store(it->peer);
    held_bytes_ -= it->bytes.size();
    held_.erase(it);
    return;
  }
  auto slice = std::chrono::duration_cast<Clock::duration>(kFirstSlice);
  while (true) {
    if (claim != nullptr && claim->taken()) return;
    const Clock::time_point until = claim != nullptr ? Clock::now() + slice : Clock::time_point::max();
    const transport::Arrival a = t.probe(sources, until, claim != nullptr);
    if (a.peer < 0) {
      slice = std::min<Clock::duration>(slice * 2, kLongestSlice);
      continue;
    }
    if (a.sig.tag != mine.tag) {
      hold(t, a);
      continue;
    }
    if (claim != nullptr && !claim->try_take()) return;
    // The transport compares the message's count, dtype and tag with this call's.
    t.wait(t.irecv(a.peer, buf, bytes));
    source.store(a.peer);
    return;
  }
}

}  // namespace chorus::communicator
