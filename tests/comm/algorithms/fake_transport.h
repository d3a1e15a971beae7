// An in-memory chorus::transport::Transport for N ranks of one process, so that the
// algorithms of src/comm/algorithms can be run and measured without sockets, shared
// memory or a communicator.
//
// A FakeHub holds one FakeTransport per rank and, between every ordered pair of ranks,
// a stream: the sends posted from one rank to the other and the receives the other
// posted from it, each a FIFO. The n-th send on a stream is matched with the n-th
// receive, whichever is posted last: the bytes are copied then, by the posting thread,
// straight from the sender's buffer into the receiver's. A send therefore completes
// only when its receive has been posted, as if the socket buffers were empty: an
// algorithm that relies on buffering deadlocks here (and ends in TimeoutError at the
// operation's deadline) where the real transport would deadlock only for messages
// larger than its buffers.
//
// Each rank's transport is driven by its own thread (the contract of transport.h), and
// all of them share the hub's one mutex; a rank's wait sleeps until a post, abort or
// interrupt that concerns it. As in the real transport:
//   * begin(op) sets the operation that later posts belong to; every send carries it
//     (kind, code, sequence number, signature) and the receiver compares it with its own,
//     so a receive matched with a send of another call fails;
//   * a receive whose length differs from the matched send's, or a mismatched call,
//     makes the receiver's wait()/wait_all() throw PeerError naming the operation, its
//     sequence number and both ranks; the send itself completes (its bytes "went out");
//   * a wait that has not completed by op.deadline throws TimeoutError listing the ranks
//     it still waits for (awaited_ranks());
//   * abort() of a rank makes every wait of its peers that involves it throw PeerError
//     ("rank R aborted: reason"), close() likewise ("rank R left"); interrupt() makes
//     the rank's own wait throw AbortedError.
// After an error a rank's transport is unusable (every later wait throws again).
//
// Unlike the real transport, the hub counts what every rank sends (traffic()): the
// number of messages and bytes per rank and per destination, so that tests can assert
// the message pattern of an algorithm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/transport/call_header.h"
#include "comm/transport/transport.h"

namespace chorus::test {

// What one rank posted as sends since the hub was made or its traffic reset.
struct Traffic {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> messages_to;  // per destination rank
};

class FakeHub;

class FakeTransport final : public transport::Transport {
 public:
  FakeTransport(FakeHub& hub, int rank);

  int rank() const override { return rank_; }
  int size() const override;
  const std::string& host_of(int rank) const override;

  void begin(const transport::OpInfo& op) override;
  transport::Request isend(int peer, const void* data, size_t len) override;
  transport::Request irecv(int peer, void* data, size_t len) override;
  void wait(const transport::Request& request) override;
  bool test(const transport::Request& request) const override;
  void wait_all() override;
  bool wait_for(const transport::Request* request, std::chrono::microseconds slice) override;
  void interrupt(const std::string& reason) override;
  void abort(const std::string& reason) override;
  void close() override;

 private:
  // Every posted request of this rank is complete; needs the hub's mu_.
  bool all_done() const;

  FakeHub& hub_;
  int rank_;
  transport::OpInfo op_;
};

class FakeHub {
 public:
  explicit FakeHub(int size);
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;

  int size() const { return size_; }
  FakeTransport& transport(int rank) { return *transports_[rank]; }

  // Safe to call from any thread; consistent once the ranks' threads are joined.
  Traffic traffic(int rank) const;
  void reset_traffic();

 private:
  friend class FakeTransport;

  // What a send carries besides its bytes: the call it belongs to.
  using Header = transport::CallHeader;
  struct Send {
    const uint8_t* data;
    size_t len;
    Header header;
  };
  struct Recv {
    uint8_t* data;
    size_t len;
    Header header;
  };
  // Messages from one rank to another (index from * size + to).
  struct Stream {
    std::deque<Send> sends;  // posted, not yet matched
    std::deque<Recv> recvs;
    uint64_t sends_posted = 0, sends_done = 0;
    uint64_t recvs_posted = 0, recvs_done = 0;
  };
  struct RankState {
    std::string failure;    // the PeerError a wait of this rank throws, once set
    std::string interrupt;  // the AbortedError reason, once interrupted
    std::string left;       // why this rank's streams ended (abort or close), once they did
    Traffic traffic;
  };

  Stream& stream(int from, int to) { return streams_[from * size_ + to]; }
  const Stream& stream(int from, int to) const { return streams_[from * size_ + to]; }
  // Pairs the queued sends and receives of a stream; needs mu_.
  void match(int from, int to);
  // Whether `request` of `rank` is complete; needs mu_.
  bool done(int rank, const transport::Request& request) const;
  // Waits until `complete()` holds for `rank` (true), or `until` passes (false), or
  // throws as the header describes.
  template <typename Complete>
  bool wait_for(int rank, const transport::OpInfo& op, Complete complete,
                std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());
  // The first peer that `rank` waits for and that has left, or -1; needs mu_.
  int departed_peer(int rank) const;

  const int size_;
  std::vector<std::unique_ptr<FakeTransport>> transports_;
  std::vector<std::string> hosts_;
  mutable std::mutex mu_;
  std::vector<std::condition_variable> wake_;  // per rank: its requests or peers changed
  std::vector<Stream> streams_;
  std::vector<RankState> ranks_;
};

}  // namespace chorus::test
