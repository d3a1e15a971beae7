// The Transport of the ranks of one node, over their streams in the node's segment
// (shm_group.h): what routed_transport.h sends to a peer on this node.
//
// Ranks are numbered as the communicator numbers them; only the group's members are
// peers (a peer on another node is a logic error of the caller, which routes).
//
// Streams: up to 9 local ranks, every ordered pair of them has its own stream slot for
// good. Beyond, each rank has 8 slots (layout.h) and binds one to a peer when it sends
// to it and holds none: first a slot never bound, else one whose receiver has read all
// of it and to which this rank has no send pending (binding the slot again needs it
// empty, so that no receiver ever finds another's bytes in it; a receiver finds its
// slot by the binding the sender wrote in it, and checks the binding again after it
// read the head). A message never spans two slots. When all 8 hold bytes not yet read,
// the send waits, like one whose ring is full, until a receiver reads (the pool is
// exhausted: at most 8 receivers of one rank's messages can be behind at once, and
// 8 x 32 KiB is what a rank can send that nobody has received yet); a receiver that
// closed, aborted or died holding a slot is an error naming it, as a peer that does
// not read a full ring is, and the deadline one naming the receivers holding slots.
//
// Every message carries a header with its call (kind, operation, sequence number and
// signature, as tcp frames do; transport.h) and its length, written into the stream
// before its bytes; the receiver compares it with its own call and fails, naming both
// calls, where they differ. A send completes once its last byte is in the ring, so a
// message that fits needs no receiver yet; a longer one moves as the receiver drains
// the ring. Data in a ring outlives its sender: a rank may send and leave.
//
// Waiting: progress happens inside wait(), wait_all() and wait_for(), which move bytes
// on every stream with pending work and, when none can move, wait as the group's
// phases wait (spin, then the segment's futex), checking the peers they wait for: one
// that aborted, closed (unless what it left in the ring is enough) or died is a
// PeerError naming it, the operation's deadline a TimeoutError naming the ranks still
// awaited and what for. After kSuspectAfter, a waiting rank publishes which call it
// waits in and for whom, and compares its own calls with what the local peers publish
// and with the first message waiting unread in each stream, so that ranks that wait
// for each other under different calls (another root, say) fail naming both.
//
// Threading: driven by one thread at a time, as every Transport; interrupt() from any.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "comm/transport/call_history.h"
#include "comm/transport/shm/shm_group.h"
#include "comm/transport/stream_transport.h"
#include "comm/transport/transport.h"

namespace chorus::transport::shm {

class ShmTransport final : public StreamTransport<ShmTransport> {
 public:
  // Over `group`'s streams (the group must outlive the transport), in a communicator of
  // `size` ranks.
  ShmTransport(ShmGroup& group, int size);

  int rank() const override { return group_.member(group_.local_rank()); }
  int size() const override { return size_; }
  const std::string& host_of(int rank) const override { return group_.host_of(rank); }
  void begin(const OpInfo& op) override;

  Request isend(int peer, const void* data, size_t len) override;
  Request irecv(int peer, void* data, size_t len) override {
    return irecv_message(peer, data, len, op_.sig);
  }
  Arrival probe(const std::vector<int>& peers, std::chrono::steady_clock::time_point until,
                bool shared_claim) override;
  Request irecv_message(int peer, void* data, size_t len, const Signature& sig) override;
  // wait(), test(), wait_all() and wait_for() are StreamTransport's, over drive_until().
  // interrupt(), abort() and close() act on the group, shared with the direct
  // algorithms: all idempotent.
  void interrupt(const std::string& reason) override { group_.interrupt(reason); }
  void abort(const std::string& reason) override;
  void close() override;

  // Before every message in a stream.
  struct Header {
    uint32_t magic;
    uint8_t kind;    // FrameKind: kCollective or kP2P
    uint8_t code;    // wire_code() of the call
    uint8_t dtype;   // the call's Signature
    uint8_t reduce;
    int32_t root;
    int32_t tag;     // send/recv: the message's tag
    uint64_t seq;     // the collective's sequence number; 0 for send/recv
    uint64_t count;   // Signature::count
    uint64_t length;  // bytes that follow
    uint64_t number;  // 1, 2, ... per stream
  };

 private:
  struct Send {
    Header header;
    const uint8_t* data;
    size_t done = 0;  // bytes of header and data written
  };
  struct Recv {
    Header want;  // what this rank's call expects (number and magic unset)
    Header got;
    uint8_t* data;
    size_t done = 0;  // bytes of header and data read
  };
  struct Peer {
    std::deque<Send> sends;
    std::deque<Recv> recvs;
    uint64_t sends_posted = 0, sends_done = 0, recvs_posted = 0, recvs_done = 0;
    uint64_t written = 0, read = 0;  // messages, for their numbers
  };

  friend class StreamTransport<ShmTransport>;
  const Peer& stream_of(int peer) const { return peers_[group_.local_of(peer)]; }
  const std::vector<Peer>& streams() const { return peers_; }

  int local(int peer) const;
  Header header_for(size_t len, const Signature& sig) const;
  // The header of the next unread message from local rank i, when it is all there.
  bool peek_header(int i, Header& h) const;
  // Whether the ring to local rank i has room (pooled: it holds a slot, or one is
  // free to bind), and whether the one from it has bytes.
  bool ring_has_room(int i) const;
  bool ring_has_bytes(int i) const;
  // The slot this rank sends to local rank i through; pooled, binds one when it holds
  // none: false when none is free.
  bool outgoing(int i, ShmGroup::Stream& st);
  // Pooled: a slot this rank could bind now (free_slot()), or -1.
  int free_slot() const;
  // The slot local rank i sends to this rank through, with its tail and head read
  // under the binding (pooled: false when it has bound none to this rank).
  bool incoming(int i, ShmGroup::Stream& st, uint64_t& tail, uint64_t& head) const;
  // Pooled: the head of the slot incoming() found, read again; false when the slot has
  // been bound to another rank since (it was empty then).
  bool reload_head(int i, const ShmGroup::Stream& st, uint64_t& head) const;
  // Pooled: the local ranks holding this rank's slots with bytes unread.
  std::vector<int> slot_holders() const;
  // Moves what can move on every stream with pending work; true when anything did.
  bool progress_all();
  bool progress_sends(int i);
  bool progress_recvs(int i);
  // The header of `r` is whole: throws when it is not the message `r` expects.
  void check_header(int i, const Recv& r);
  // Moves bytes until pred() (true) or `until` (false; max(): no end but the
  // operation's deadline). Inlined into each wait (stream_transport.h), the hot path,
  // with its predicate: the waits' lambdas have linkage, so the compiler would keep the
  // two of wait_for() out of line.
  template <class Pred>
  [[gnu::always_inline]] inline bool drive_until(Pred pred, Clock::time_point until);
  // Before a nap: peers waited for that aborted, closed or died; after kSuspectAfter
  // the calls the peers wait in and the first unread message of every stream.
  void check_waits(bool liveness);
  void look_for_mismatch();
  // Throws when `h` (from local rank i, or published by it) names a call of this rank's
  // made with another operation or signature.
  void check_against_call(int i, uint8_t code, uint64_t seq, const Signature& sig);
  [[noreturn]] void fail_timeout() const;
  std::string describe(const Header& h, bool own) const;

  ShmGroup& group_;
  const int size_;
  const bool pooled_;          // group_.pooled()
  std::vector<Peer> peers_;  // by local rank
  // Pooled: this rank's slots (by peer: its slot or -1; by slot: its peer or -1), the
  // bindings so far, where the search for a free one starts; and by sending peer, the
  // slot and binding it was last found in.
  std::vector<int> out_slot_, holder_;
  uint64_t bindings_ = 0;
  int next_slot_ = 0;
  mutable std::vector<int> in_slot_;
  mutable std::vector<uint64_t> in_binding_;
  OpInfo op_;
  CallHistory calls_;
  Clock::time_point first_nap_{};  // of the current operation
  bool suspect_ = false;
};

}  // namespace chorus::transport::shm

// Instantiated in shm_transport.cc, beside drive_until() (stream_transport.h).
extern template class chorus::transport::StreamTransport<chorus::transport::shm::ShmTransport>;
