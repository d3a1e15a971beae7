#include "comm/transport/shm/shm_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "chorus/error.h"

namespace chorus::transport::shm {
namespace {

constexpr uint32_t kMessageMagic = 0x70327073;  // "sp2p"
// A stream moves at most this much before it publishes its progress, so that the
// receiver copies out while the sender copies in. 2 ranks, a message each way: 4 KiB
// pieces were slowest at every size (2 MiB 494-517 us, 16 MiB 4.3-4.7 ms), 16 and 32 KiB
// about equal (2 MiB 395-461 us, 16 MiB 3.4-3.8 ms), 64 KiB slower below 2 MiB.
constexpr size_t kStreamPiece = 16 * 1024;
constexpr size_t kHeaderBytes = sizeof(ShmTransport::Header);

uint64_t load(uint64_t* word, std::memory_order order) { return std::atomic_ref<uint64_t>(*word).load(order); }
void store(uint64_t* word, uint64_t value) {
  // Sequentially consistent, as an arrival: pairs with a sleeper's last check.
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_seq_cst);
}

Signature signature(const ShmTransport::Header& h) {
  return Signature{h.count, h.root, h.dtype, h.reduce, h.tag};
}

}  // namespace

ShmTransport::ShmTransport(ShmGroup& group, int size)
    : group_(group), size_(size), pooled_(group.pooled()), peers_(static_cast<size_t>(group.local_size())) {
  if (pooled_) {
    out_slot_.assign(peers_.size(), -1);
    holder_.assign(static_cast<size_t>(group.slots()), -1);
    in_slot_.assign(peers_.size(), -1);
    in_binding_.assign(peers_.size(), 0);
  }
}

bool ShmTransport::incoming(int i, ShmGroup::Stream& st, uint64_t& tail, uint64_t& head) const {
  const int me = group_.local_rank();
  if (!pooled_) {
    st = group_.stream(i, me);
    tail = load(st.tail, std::memory_order_relaxed);  // only this rank writes it
    head = load(st.head, std::memory_order_acquire);
    return true;
  }
  // The slot and binding found last, else a search of the sender's slots. The tail was
  // written by the slot's earlier receivers too: read after the binding, acquiring
  // (one of theirs seen means the binding that followed it is seen below); the binding
  // read again after the head: unchanged, both belong to this rank's binding.
  auto read = [&](int k, bool any) {
    st = group_.slot(i, k);
    const uint64_t b = load(st.binding, std::memory_order_acquire);
    if (any ? (b & 0xffffffffu) != static_cast<uint64_t>(me) + 1 : b != in_binding_[i]) return false;
    tail = load(st.tail, std::memory_order_acquire);
    head = load(st.head, std::memory_order_acquire);
    if (load(st.binding, std::memory_order_acquire) != b) return false;
    in_slot_[i] = k;
    in_binding_[i] = b;
    return true;
  };
  if (in_slot_[i] >= 0 && read(in_slot_[i], false)) return true;
  for (int k = 0; k < group_.slots(); ++k) {
    if (read(k, true)) return true;
  }
  in_slot_[i] = -1;
  return false;
}

bool ShmTransport::reload_head(int i, const ShmGroup::Stream& st, uint64_t& head) const {
  head = load(st.head, std::memory_order_acquire);
  return load(st.binding, std::memory_order_acquire) == in_binding_[i];
}

int ShmTransport::free_slot() const {
  const int slots = group_.slots();
  for (int n = 0; n < slots; ++n) {
    const int k = (next_slot_ + n) % slots;
    const int h = holder_[k];
    if (h < 0) return k;
    if (!peers_[h].sends.empty()) continue;  // it will need the slot again
    const ShmGroup::Stream st = group_.slot(group_.local_rank(), k);
    if (load(st.tail, std::memory_order_acquire) == load(st.head, std::memory_order_relaxed)) return k;
  }
  return -1;
}

bool ShmTransport::outgoing(int i, ShmGroup::Stream& st) {
  const int me = group_.local_rank();
  if (!pooled_) {
    st = group_.stream(me, i);
    return true;
  }
  int k = out_slot_[i];
  if (k < 0) {
    if ((k = free_slot()) < 0) return false;
    if (holder_[k] >= 0) out_slot_[holder_[k]] = -1;
    holder_[k] = i;
    out_slot_[i] = k;
    next_slot_ = (k + 1) % group_.slots();
    // Empty (tail == head, read above): no receiver reads it until it sees this binding.
    store(group_.slot(me, k).binding, (++bindings_ << 32) | (static_cast<uint64_t>(i) + 1));
  }
  st = group_.slot(me, k);
  return true;
}

std::vector<int> ShmTransport::slot_holders() const {
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(holder_.size()); ++k) {
    const int h = holder_[k];
    if (h < 0) continue;
    const ShmGroup::Stream st = group_.slot(group_.local_rank(), k);
    if (load(st.tail, std::memory_order_acquire) != load(st.head, std::memory_order_relaxed)) out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int ShmTransport::local(int peer) const {
  const int i = peer >= 0 && peer < size_ ? group_.local_of(peer) : -1;
  if (i < 0 || i == group_.local_rank()) {
    throw std::logic_error("ShmTransport: rank " + std::to_string(peer) +
                           " is not another rank of this node");
  }
  return i;
}

void ShmTransport::begin(const OpInfo& op) {
  op_ = op;
  group_.begin(op);
  calls_.record(op);
  first_nap_ = Clock::time_point{};
  suspect_ = false;
  group_.clear_waiting();
}

ShmTransport::Header ShmTransport::header_for(size_t len, const Signature& sig) const {
  Header h{};
  h.magic = kMessageMagic;
  h.kind = static_cast<uint8_t>(op_.kind);
  h.code = op_.code;
  h.dtype = sig.dtype;
  h.reduce = sig.reduce;
  h.root = sig.root;
  h.seq = op_.kind == FrameKind::kP2P ? 0 : op_.seq;  // p2p numbers differ between ranks
  h.count = sig.count;
  h.tag = sig.tag;
  h.length = len;
  return h;
}

Request ShmTransport::isend(int peer, const void* data, size_t len) {
  Peer& p = peers_[local(peer)];
  Send s{header_for(len, op_.sig), static_cast<const uint8_t*>(data)};
  s.header.number = ++p.written;
  p.sends.push_back(s);
  return Request{peer, true, p.sends_posted++};
}

Request ShmTransport::irecv_message(int peer, void* data, size_t len, const Signature& sig) {
  Peer& p = peers_[local(peer)];
  p.recvs.push_back(Recv{header_for(len, sig), Header{}, static_cast<uint8_t*>(data)});
  return Request{peer, false, p.recvs_posted++};
}

bool ShmTransport::peek_header(int i, Header& h) const {
  ShmGroup::Stream st;
  uint64_t tail, head;
  if (!incoming(i, st, tail, head) || head - tail < kHeaderBytes) return false;
  auto* to = reinterpret_cast<uint8_t*>(&h);
  for (size_t k = 0; k < kHeaderBytes; ++k) to[k] = st.ring[(tail + k) % st.capacity];
  return true;
}

Arrival ShmTransport::probe(const std::vector<int>& peers, Clock::time_point until, bool shared_claim) {
  std::vector<int> locals;
  for (int peer : peers) locals.push_back(local(peer));
  // With a shared claim: the peers whose next message belongs to a later operation,
  // left unread and not waited for until the claim is settled.
  std::vector<char> later(locals.size(), 0);
  while (true) {
    for (size_t k = 0; k < locals.size(); ++k) {
      Header h;
      if (later[k] || !peek_header(locals[k], h)) continue;
      const bool next = h.magic == kMessageMagic && h.number == peers_[locals[k]].read + 1;
      if (!next || h.kind != static_cast<uint8_t>(FrameKind::kP2P)) {
        if (next && shared_claim) {  // the next message, of a later operation
          later[k] = 1;
          continue;
        }
        // Not the send/recv message that comes next: the receive explains it.
        Recv r{header_for(h.length, op_.sig), h, nullptr};
        ++peers_[locals[k]].read;
        check_header(locals[k], r);
        throw std::logic_error("ShmTransport::probe: a message that is not the next send/recv passed");
      }
      return Arrival{peers[k], signature(h), h.length};
    }
    if (Clock::now() >= until) return Arrival{};
    group_.wait_streams(
        [&] {
          for (size_t k = 0; k < locals.size(); ++k) {
            if (later[k]) continue;
            ShmGroup::Stream st;
            uint64_t tail, head;
            if (incoming(locals[k], st, tail, head) && head - tail >= kHeaderBytes) return true;
          }
          return false;
        },
        [&](bool liveness) {
          group_.check_interrupt();
          for (size_t k = 0; k < locals.size(); ++k) {
            const int i = locals[k];
            if (ring_has_bytes(i)) continue;  // what it wrote before leaving is still here
            if (shared_claim && group_.has_closed(i)) continue;  // the claim may be taken elsewhere
            group_.check_peer(i, liveness, true,
                              "closed the communicator while this rank waited for it to send",
                              "while this rank waited for it to send in shared memory");
          }
        },
        [&] {
          std::vector<std::string> names;
          for (int i : locals) names.push_back(group_.rank_name(i));
          throw TimeoutError(probe_timeout_text(group_.op_name(), group_.rank_name(group_.local_rank()),
                                                " in shared memory", op_.sig.tag, names),
                             peers);
        },
        until);
  }
}

template <class Pred>
bool ShmTransport::drive_until(Pred pred, Clock::time_point until) {
  // Whether a stream with pending work can move.
  auto can_move = [&] {
    for (size_t i = 0; i < peers_.size(); ++i) {
      const Peer& p = peers_[i];
      if ((!p.sends.empty() && ring_has_room(static_cast<int>(i))) ||
          (!p.recvs.empty() && ring_has_bytes(static_cast<int>(i)))) {
        return true;
      }
    }
    return false;
  };
  while (true) {
    progress_all();
    if (pred()) return true;
    if (until != Clock::time_point::max() && Clock::now() >= until) return false;
    if (!group_.wait_streams(can_move, [&](bool liveness) { check_waits(liveness); },
                             [&] { fail_timeout(); }, until)) {
      progress_all();
      return pred();
    }
  }
}

bool ShmTransport::ring_has_room(int i) const {
  ShmGroup::Stream st;
  if (!pooled_) {
    st = group_.stream(group_.local_rank(), i);
  } else if (out_slot_[i] >= 0) {
    st = group_.slot(group_.local_rank(), out_slot_[i]);
  } else {
    return free_slot() >= 0;
  }
  return load(st.head, std::memory_order_relaxed) - load(st.tail, std::memory_order_acquire) < st.capacity;
}

bool ShmTransport::ring_has_bytes(int i) const {
  ShmGroup::Stream st;
  uint64_t tail, head;
  return incoming(i, st, tail, head) && head != tail;
}

bool ShmTransport::progress_all() {
  bool moved = false;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (!peers_[i].sends.empty()) moved |= progress_sends(static_cast<int>(i));
    if (!peers_[i].recvs.empty()) moved |= progress_recvs(static_cast<int>(i));
  }
  return moved;
}

bool ShmTransport::progress_sends(int i) {
  Peer& p = peers_[i];
  ShmGroup::Stream st;
  if (!outgoing(i, st)) return false;  // every slot holds bytes not yet read
  uint64_t head = load(st.head, std::memory_order_relaxed);  // only this rank writes it
  bool moved = false;
  while (!p.sends.empty()) {
    Send& s = p.sends.front();
    const size_t total = kHeaderBytes + s.header.length;
    while (s.done < total) {
      const uint64_t tail = load(st.tail, std::memory_order_acquire);
      const size_t room = st.capacity - static_cast<size_t>(head - tail);
      if (room == 0) break;
      const size_t at = head % st.capacity;
      size_t k = std::min({total - s.done, room, st.capacity - at, kStreamPiece});
      const uint8_t* from;
      if (s.done < kHeaderBytes) {
        k = std::min(k, kHeaderBytes - s.done);
        from = reinterpret_cast<const uint8_t*>(&s.header) + s.done;
      } else {
        from = s.data + (s.done - kHeaderBytes);
      }
      std::memcpy(st.ring + at, from, k);
      head += k;
      s.done += k;
      store(st.head, head);
      group_.notify();
      moved = true;
    }
    if (s.done < total) break;
    p.sends.pop_front();
    ++p.sends_done;
  }
  return moved;
}

bool ShmTransport::progress_recvs(int i) {
  Peer& p = peers_[i];
  ShmGroup::Stream st;
  uint64_t tail, head;
  if (!incoming(i, st, tail, head)) return false;  // pooled: no slot of i's is bound to this rank
  bool moved = false;
  bool fresh = true;  // `head` just read
  while (!p.recvs.empty()) {
    Recv& r = p.recvs.front();
    while (r.done < kHeaderBytes + r.want.length) {
      if (!fresh) {
        if (!pooled_) {
          head = load(st.head, std::memory_order_acquire);
        } else if (head == tail && !reload_head(i, st, head)) {
          return moved;  // read empty, then bound to another rank: the next call finds the new slot
        }
      }
      fresh = false;
      if (head == tail) break;
      const size_t at = tail % st.capacity;
      size_t k = std::min({static_cast<size_t>(head - tail), st.capacity - at, kStreamPiece});
      if (r.done < kHeaderBytes) {
        k = std::min(k, kHeaderBytes - r.done);
        std::memcpy(reinterpret_cast<uint8_t*>(&r.got) + r.done, st.ring + at, k);
      } else {
        k = std::min(k, kHeaderBytes + r.want.length - r.done);
        std::memcpy(r.data + (r.done - kHeaderBytes), st.ring + at, k);
      }
      tail += k;
      r.done += k;
      store(st.tail, tail);
      group_.notify();
      moved = true;
      if (r.done == kHeaderBytes) {
        ++p.read;
        check_header(i, r);
      }
    }
    if (r.done < kHeaderBytes + r.want.length) break;
    p.recvs.pop_front();
    ++p.recvs_done;
  }
  return moved;
}

std::string ShmTransport::describe(const Header& h, bool own) const {
  const bool p2p = h.kind == static_cast<uint8_t>(FrameKind::kP2P);
  const char* name = p2p ? (own ? op_.name : "send") : nullptr;
  return describe_call(h.code, name, h.seq, p2p, signature(h));
}

void ShmTransport::check_header(int i, const Recv& r) {
  const Header& g = r.got;
  const Header& w = r.want;
  const std::string here = group_.op_name() + " failed on " + group_.rank_name(group_.local_rank()) + ": ";
  const std::string peer = group_.rank_name(i);
  if (g.magic != kMessageMagic || g.number != peers_[i].read) {
    throw PeerError(here + "corrupt message from " + peer + " in shared memory (expected message " +
                    std::to_string(peers_[i].read) + ", found magic " + std::to_string(g.magic) +
                    " and number " + std::to_string(g.number) + ")");
  }
  const bool same_call =
      g.kind == w.kind && g.code == w.code && g.seq == w.seq && signature(g) == signature(w);
  if (same_call && g.length == w.length) return;
  if (same_call) {
    throw PeerError(here + "mismatched message from " + peer + ": it sent " + std::to_string(g.length) +
                    " bytes where this rank expects " + std::to_string(w.length) +
                    ": the ranks issued different operations, counts or types, or ran them "
                    "with algorithms that differ");
  }
  const bool p2p = g.kind == static_cast<uint8_t>(FrameKind::kP2P);
  if (p2p && w.kind == g.kind) {
    throw PeerError(here + mismatch_text(peer, group_.member(i), describe(g, false), describe(w, true)));
  }
  if (!p2p) check_against_call(i, g.code, g.seq, signature(g));
  throw PeerError(here + "mismatched message from " + peer + ": expected " + describe(w, true) +
                  ", got " + describe(g, false) +
                  ": the ranks issued different operations, counts or types");
}

void ShmTransport::check_against_call(int i, uint8_t code, uint64_t seq, const Signature& sig) {
  // The consistency check of CHORUS_DEBUG=DETAIL shares its collective's number.
  if (code == kConsistencyCheckCode) return;
  const Call* mine = calls_.of(static_cast<uint32_t>(seq));
  if (mine == nullptr || mine->seq != seq || mine->code == kConsistencyCheckCode) return;
  if (mine->code == code && mine->sig == sig) return;
  throw PeerError(group_.op_name() + " failed on " + group_.rank_name(group_.local_rank()) + ": " +
                  mismatch_text(group_.rank_name(i), group_.member(i),
                                describe_call(code, nullptr, seq, false, sig),
                                describe_call(mine->code, nullptr, mine->seq, false, mine->sig)));
}

void ShmTransport::check_waits(bool liveness) {
  group_.check_interrupt();
  uint64_t awaited = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (p.sends.empty() && p.recvs.empty()) continue;
    const std::string what = p.recvs.empty() ? "receive" : "send";
    try {
      group_.check_peer(static_cast<int>(i), liveness, true,
                        "closed the communicator while this rank waited for it to " + what,
                        "while this rank waited for it to " + what + " in shared memory");
    } catch (const PeerError&) {
      // What it wrote before it left is still for this rank to take.
      if (p.recvs.empty() || !ring_has_bytes(static_cast<int>(i))) throw;
    }
    if (!p.recvs.empty()) awaited |= uint64_t{1} << std::min<size_t>(i, 63);
  }
  if (pooled_ && free_slot() < 0) {
    // Sends that wait for a slot wait for the receivers holding them to read.
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (peers_[i].sends.empty() || out_slot_[i] >= 0) continue;
      const std::string to = " to " + group_.rank_name(static_cast<int>(i));
      for (int h : slot_holders()) {
        group_.check_peer(h, liveness, true,
                          "closed the communicator without reading what this rank sent it, holding a "
                          "stream slot this rank needs to send" + to,
                          "holding a stream slot this rank needs to send" + to + " in shared memory");
      }
      break;
    }
  }
  const auto now = Clock::now();
  if (first_nap_ == Clock::time_point{}) first_nap_ = now;
  if (!suspect_ && now - first_nap_ >= kSuspectAfter && op_.kind == FrameKind::kCollective) {
    suspect_ = true;
    group_.publish_waiting(OpDesc{op_.seq, op_.sig, op_.code, op_.code}, awaited);
  }
  if (suspect_) look_for_mismatch();
}

// A rank that has waited kSuspectAfter compares its calls with those its local peers
// wait in for it, and with the first message that waits unread in each stream: ranks
// that disagree on a broadcast's root, each waiting for its parent, never send each
// other anything that a receive would check.
void ShmTransport::look_for_mismatch() {
  const int me = group_.local_rank();
  for (int j = 0; j < static_cast<int>(peers_.size()); ++j) {
    if (j == me) continue;
    OpDesc call;
    uint64_t awaited = 0;
    if (group_.read_waiting(j, call, awaited) && ((awaited >> std::min(me, 63)) & 1) != 0) {
      check_against_call(j, call.code, call.seq, call.sig);
    }
    const Peer& p = peers_[j];
    if (!p.recvs.empty() && p.recvs.front().done > 0) continue;  // inside a message
    ShmGroup::Stream st;
    uint64_t tail, head;
    if (!incoming(j, st, tail, head) || head - tail < kHeaderBytes) continue;
    Header h;
    auto* to = reinterpret_cast<uint8_t*>(&h);
    for (size_t k = 0; k < kHeaderBytes; ++k) to[k] = st.ring[(tail + k) % st.capacity];
    if (h.magic == kMessageMagic && h.kind == static_cast<uint8_t>(FrameKind::kCollective)) {
      check_against_call(j, h.code, h.seq, signature(h));
    }
  }
}

void ShmTransport::fail_timeout() const {
  std::ostringstream m;
  m << group_.op_name() << " timed out on " << group_.rank_name(group_.local_rank())
    << " waiting in shared memory for";
  std::vector<int> awaited;
  for (size_t i = 0; i < peers_.size(); ++i) {
    const Peer& p = peers_[i];
    if (!p.recvs.empty()) {
      const Recv& r = p.recvs.front();
      m << " " << group_.rank_name(static_cast<int>(i)) << " to send "
        << (kHeaderBytes + r.want.length - r.done) << " bytes;";
    } else if (!p.sends.empty() && pooled_ && out_slot_[i] < 0) {
      const Send& s = p.sends.front();
      m << " a stream slot to send " << (kHeaderBytes + s.header.length - s.done) << " bytes to "
        << group_.rank_name(static_cast<int>(i)) << " (all " << group_.slots()
        << " of this rank's hold bytes not read by";
      for (int h : slot_holders()) {
        m << " " << group_.rank_name(h);
        awaited.push_back(group_.member(h));
      }
      m << ");";
      continue;  // waits for them, not for the receiver
    } else if (!p.sends.empty()) {
      const Send& s = p.sends.front();
      m << " " << group_.rank_name(static_cast<int>(i)) << " to receive "
        << (kHeaderBytes + s.header.length - s.done) << " bytes (not reading);";
    } else {
      continue;
    }
    awaited.push_back(group_.member(static_cast<int>(i)));
  }
  m << " (a peer is stopped, hung, or behind in a different operation)";
  std::sort(awaited.begin(), awaited.end());
  awaited.erase(std::unique(awaited.begin(), awaited.end()), awaited.end());
  throw TimeoutError(m.str(), std::move(awaited));
}

void ShmTransport::abort(const std::string& reason) {
  for (Peer& p : peers_) {  // pending requests are dropped
    p.sends.clear();
    p.recvs.clear();
  }
  group_.abort(reason);
}

void ShmTransport::close() { group_.close(); }

}  // namespace chorus::transport::shm

// The waits, with drive_until() above inlined into them (stream_transport.h).
template class chorus::transport::StreamTransport<chorus::transport::shm::ShmTransport>;
