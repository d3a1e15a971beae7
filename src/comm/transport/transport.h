// The transport interface: moves bytes between two ranks of a communicator.
// Algorithms see only this interface, never sockets or shared memory.
//
// Model: between every pair of ranks there is one ordered stream in each direction.
// isend()/irecv() queue a message on that stream and return at once; messages on one
// stream are matched in the order they were posted on both sides, and each carries a
// header (kind, operation, sequence number, length, and the call's signature: dtype,
// reduction, root, count; see OpInfo) so that a mismatch between what one rank sent and
// what the other expected, or between the calls the two made, is an error naming both
// sides, not silent corruption.
//
// A receiver compares every header with its own call. One that waits for a peer that
// never sends (the ranks disagree on the root, say) would see no header at all: after
// kSuspectAfter without completing, a waiting rank also looks at the first frame the
// other peers have sent it (compared with the call of that sequence number, if this
// rank made it) and tells the peers it waits for which call it waits in, so that two
// ranks waiting for each other under different calls find out too.
//
// Threading: a transport is driven by one thread at a time (the communicator's
// progress thread). Progress happens only inside wait()/wait_all(), which poll every
// stream with pending work, so sends and receives to different peers proceed together.
//
// Errors: wait()/wait_all() throw PeerError (a peer died, closed, aborted, sent a bad
// frame or made another call: "allreduce #7 failed on rank 1 (host h): mismatch with
// rank 0 (host h): rank 0 called allreduce #7 with f64 × 1000, sum; this rank called
// allreduce #7 with f32 × 2000, sum") or TimeoutError (the operation's deadline
// passed); the messages name the operation, its sequence number, the peer's rank and
// host. After an error the transport is unusable; abort() tells the peers and closes
// every stream.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/types.h"
#include "comm/common/deadline.h"

namespace chorus::transport {

enum class FrameKind : uint8_t {
  kCollective = 1,  // data of a collective; seq = the collective's sequence number
  kP2P = 2,         // data of send/recv; seq = per-stream counter
  kAbort = 3,       // the sender aborted; payload = reason text
  kGoodbye = 4,     // the sender closed the communicator cleanly
  kWaiting = 5,     // no payload: the sender waits for this rank in the call of the header
};

// The operation byte of frame headers and shared-memory descriptors: a Collective's
// value (chorus/types.h), so that a rank that receives a frame of another collective
// than it is running can tell. A recv carries its send's code (kSend), since the two
// must match; the fingerprint exchange of CHORUS_DEBUG=DETAIL, the same on every rank
// whatever collective it is about to run, has a code of its own beyond the enum.
constexpr uint8_t wire_code(Collective c) {
  return static_cast<uint8_t>(c == Collective::kRecv ? Collective::kSend : c);
}
inline constexpr uint8_t kConsistencyCheckCode = 0x40;
// "allreduce", ..., "send/recv" for kSend's code, "consistency check", "?" otherwise.
const char* op_code_name(uint8_t code);

// What identifies a call across ranks beyond the operation and its sequence number:
// every rank of a collective passes the same, and a recv the same as its send. Written
// in every tcp frame header and shared-memory descriptor and message header, and
// compared by the receiver.
inline constexpr uint8_t kNoDtype = 0xff, kNoReduce = 0xff;
struct Signature {
  // The count argument that every rank passes (allreduce, broadcast, reduce, allgather:
  // count; reduce_scatter: recv_count; gather, scatter, alltoall: count per rank;
  // allgatherv: a digest of recv_counts, see counts_digest(); send/recv: the message's
  // count); 0 where counts differ by design (alltoallv, which checks them itself).
  uint64_t count = 0;
  int32_t root = -1;         // broadcast, reduce, gather, scatter; -1 otherwise
  uint8_t dtype = kNoDtype;  // a DataType
  uint8_t reduce = kNoReduce;  // a ReduceOp where the call reduces
  int32_t tag = 0;             // send/recv: the message's tag (0 for collectives)
  bool operator==(const Signature&) const = default;
};

// FNV-1a over recv_counts: the allgatherv count that every rank must agree on.
uint64_t counts_digest(const size_t* counts, size_t n);

// What the transport reports in errors and writes in headers for the current operation.
struct OpInfo {
  const char* name = "";  // "allreduce", "creation barrier"
  uint8_t code = 0;       // wire_code() of the collective, or kConsistencyCheckCode
  uint64_t seq = 0;       // sequence number of the operation on this communicator
  FrameKind kind = FrameKind::kCollective;
  Deadline deadline{std::chrono::milliseconds(0)};
  Signature sig;
};

// "allreduce #7 with f32 × 2000, sum", "broadcast #3 with f64 × 10, root 1", "barrier #4",
// "allgatherv #5 with f32 × recv_counts of digest 9f0c...", "send with f32 × 100" (no
// sequence number: p2p numbers differ between the two ranks). `code` is wire_code(),
// `name` the operation's own name where it has one (send or recv), else null.
std::string describe_call(uint8_t code, const char* name, uint64_t seq, bool p2p,
                          const Signature& sig);
// "mismatch with <peer>: rank P called <theirs>; this rank called <mine> (...)", the part
// of a mismatch error after "<op> #<seq> failed on <this rank>: ".
std::string mismatch_text(const std::string& peer, int peer_rank, const std::string& theirs,
                          const std::string& mine);

// The TimeoutError text of a probe() past the operation's deadline: "recv #3 timed out
// on rank 0 (host h) waiting for rank 2 (host h, ...) to send a message with tag 5" (or
// "for any of: rank 1 (...), rank 2 (...) to send ..."); `where`: " in shared memory" or
// empty.
std::string probe_timeout_text(const std::string& op, const std::string& here,
                               const std::string& where, int tag,
                               const std::vector<std::string>& from);

// A wait that has not completed after this long looks further than the streams it
// waits on (see the model above). Far above any healthy wait on one machine (1 MiB
// allreduce, 4 ranks over loopback: about 2 ms) so that it costs nothing there, and far
// below any operation timeout.
inline constexpr std::chrono::milliseconds kSuspectAfter{100};

// What probe() finds: the next unread send/recv message of a peer, announced by its
// header (nothing of it consumed). peer -1: none arrived in time.
struct Arrival {
  int peer = -1;
  Signature sig;    // the sender's call: dtype, count, tag
  size_t length = 0;  // payload bytes
};

// Identifies a posted message: the peer, the direction and the position in that
// stream. Cheap to copy.
struct Request {
  int peer = -1;
  bool is_send = false;
  uint64_t index = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Host name of `rank` as published at connection time.
  virtual const std::string& host_of(int rank) const = 0;

  // Sets the operation that the following posts belong to.
  virtual void begin(const OpInfo& op) = 0;

  // Queues `len` bytes to `peer`. `data` must stay valid and unchanged until the
  // request completes (wait() on it, or wait_all()).
  virtual Request isend(int peer, const void* data, size_t len) = 0;
  // Queues a receive of exactly `len` bytes from `peer` into `data`.
  virtual Request irecv(int peer, void* data, size_t len) = 0;

  // Drives all streams until `request` is complete.
  virtual void wait(const Request& request) = 0;
  // Whether `request` is complete, without driving any stream.
  virtual bool test(const Request& request) const = 0;
  // Drives all streams until every posted request is complete.
  virtual void wait_all() = 0;
  // Drives all streams until `request` is complete (null: every posted request), or for
  // about `slice` at most: true when it completed. What a transport made of others
  // (routed_transport.h) calls to drive each of them in turn. Errors and the
  // operation's deadline as in wait().
  virtual bool wait_for(const Request* request, std::chrono::microseconds slice) = 0;

  // Send/recv only (the operation's kind is kP2P). Waits until the next unread message
  // of one of `peers`, none of which may have a receive posted, has arrived (its header
  // at least) or `until` passes; returns the first found, or peer -1. Consumes nothing:
  // an irecv() from that peer then takes the message. Errors as wait(): a peer of
  // `peers` that died, aborted or left, the operation's deadline, interrupt(). Also
  // consumes and checks what is not a message (waiting frames). Transports that carry
  // no send/recv (views) throw std::logic_error.
  //
  // With `shared_claim` (a receive whose RecvClaim a receive on another communicator
  // may take), a peer that can no longer send this receive a message is no error while
  // the deadline lasts: one that left, or whose next frame belongs to a later
  // operation (a collective it began once the other communicator had its message).
  // Such a peer is left as it is, and probe() returns peer -1 at `until` as usual, so
  // that the caller sees whether the claim was taken; at the deadline it times out.
  virtual Arrival probe(const std::vector<int>& peers, std::chrono::steady_clock::time_point until,
                        bool shared_claim);
  // Like irecv(), of a send/recv message that probe() announced with `sig`: the
  // message's own call is expected rather than this operation's (the caller keeps a
  // message that arrived before its receive was posted, and compares later).
  virtual Request irecv_message(int peer, void* data, size_t len, const Signature& sig);

  // Thread-safe: makes the wait in progress (or the next one) throw AbortedError with
  // `reason` promptly. The driving thread then calls abort().
  virtual void interrupt(const std::string& reason) = 0;

  // Tells every peer that this rank aborts (best effort, never blocks long) and closes
  // every stream. Pending requests are dropped. Idempotent.
  virtual void abort(const std::string& reason) = 0;
  // Tells every peer that this rank leaves cleanly and closes every stream.
  virtual void close() = 0;
};

}  // namespace chorus::transport
