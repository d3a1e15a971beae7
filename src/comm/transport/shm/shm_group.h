// The ranks of one node, meeting in one shared-memory segment.
//
// Every local rank owns two buffers in the segment (used alternately, so that one
// chunk can be filled while the previous one is still being read) and a control block
// with its arrival counter. Direct algorithms (algorithms/shm/, through the NodeGroup
// interface of node_group.h, which this class implements) move data
// through the buffers and synchronise in phases: arrive() publishes "I reached the
// next phase", wait_all() returns once every local rank has. Every rank runs the same
// sequence of phases, so the counters need no reset.
//
// Waiting spins briefly (less when the node has more ranks than cores) and then sleeps
// on a futex in the segment; arrive() wakes sleepers only when there are any. While
// waiting, the rank checks its peers: one that aborted (its reason is in its control
// block), closed, or died (its process exited: seen through a pidfd within
// kLivenessPeriod) turns into PeerError naming the operation, both ranks and hosts; the
// operation's deadline into TimeoutError naming the ranks still awaited.
//
// The first phase of every operation also compares a descriptor of the collective
// (the call: operation, sequence number and signature, see transport.h; and the step
// that runs here) across ranks, so that ranks calling different collectives, or the
// same one with another dtype, count, op or root, fail with a message naming both calls
// instead of exchanging wrong data. Every rank compares, so every rank fails. What the
// ranks compare is a 64-bit fingerprint of the descriptor, kept with the arrival counter
// in one cache line (and, for arrive_small(), up to 16 bytes of data), so that a small
// collective's phase moves one line between cores; the descriptors themselves are read
// only when fingerprints differ.
//
// Point to point: every local rank has stream slots in the segment, rings that only it
// writes, each read by one receiver at a time: a slot per peer up to 9 local ranks, 8
// slots bound to peers on demand beyond (layout.h), so that the segment grows with the
// ranks, not with their pairs. ShmTransport (shm_transport.h) moves messages through
// them behind the Transport interface; the group only lays them out (slot(),
// stream()) and lends it its waits, checks and errors.
//
// Shared work: after a phase that every rank has passed, the ranks can share a round of
// numbered pieces out (begin_work() with the same count on every rank). Each rank has a
// contiguous share, taken one piece at a time from a counter in its control block
// (take_piece()); a rank that has none left of its own takes the next of another's, so
// whichever ranks run do all the work, and it counts each piece done (finish_piece());
// wait_work() returns once every piece of the round is done. With more ranks than
// cores, the ranks that run do the work of those that wait for a core; a rank that
// waits first does the share of peers still busy elsewhere. While every rank keeps to
// its own share, no counter moves between the cores. A rank that dies or stops holding
// a piece is an error or a timeout naming it, as in a phase.
//
// Cross-memory attach: where the kernel lets the ranks read each other's memory
// (process_vm_readv: same user, ptrace allowed; tried at set-up, and the ranks agree),
// large collectives can read a peer's own input and output buffers directly, one copy
// instead of two through the segment. A rank publishes its buffers' addresses with
// publish_buffers() before an arrival; peers read them with read_peer() between that
// arrival and the rank's next one that says it is done with them.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "comm/transport/shm/node_group.h"
#include "comm/transport/shm/peer_files.h"
#include "comm/transport/shm/segment.h"
#include "comm/transport/transport.h"

namespace chorus::transport::shm {

// What each rank publishes about the collective it runs, compared at its first phase:
// the call (from begin()) and the step of it that runs in shared memory, the
// collective itself or a node phase of a hierarchical one.
struct OpDesc {
  uint64_t seq = 0;
  Signature sig;
  uint8_t code = 0;  // wire_code() of the call
  uint8_t step = 0;  // wire_code() of what runs here
  bool operator==(const OpDesc&) const = default;
};

struct GroupConfig {
  int rank = 0;                     // this rank, communicator numbering
  std::vector<int> members;         // the node's ranks (communicator numbering), ascending
  std::vector<std::string> hosts;   // host of every rank of the communicator
  int node = 0;                     // node index, for store keys
  // Each of a rank's two buffers, at most: beyond 32 local ranks the group gives each
  // less, so that all fit in 64 MiB (layout.h; buffer_bytes() says what it gave).
  size_t buffer_bytes = 1024 * 1024;
  bool try_cma = true;              // try cross-memory attach (CHORUS_SHM_CMA=0: no)
  // Also in groups of more than two ranks (CHORUS_SHM_CMA=all). Off by default: a
  // reduce-scatter rank then reads (p-1)/p of the data through the kernel, which pins
  // every page it reads; measured on the allreduce (which then read through the kernel
  // too), 4 ranks on a 2-core machine, the segment path was 1.1-1.3x faster from 256 KiB
  // to 16 MiB.
  bool cma_any_size = false;
  // How a waiter spins before it sleeps (algorithms::Tuning: shm_spins,
  // shm_oversubscribed_yields, shm_oversubscribed_spins, where they are measured).
  int spins = 20000;
  int oversubscribed_yields = 64;
  int oversubscribed_spins = 250;
};

class ShmGroup final : public NodeGroup {
 public:
  static constexpr std::chrono::milliseconds kLivenessPeriod{50};

  // Sets the group up through `store` (scoped to the communicator): local rank 0
  // creates the segment and publishes its name, the others map it, then every rank
  // reports whether it succeeded. Returns null on every rank of the node when any of
  // them failed (the reason in `why_not`), so that all fall back together. The segment
  // is unlinked once all have mapped it.
  static std::unique_ptr<ShmGroup> connect(Store& store, const GroupConfig& config,
                                           std::string& why_not);
  ~ShmGroup() override;

  // NodeGroup: what the direct algorithms call (node_group.h says what each does).
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  size_t buffer_bytes() const override { return config_.buffer_bytes; }
  uint8_t* buffer(int i, int which) const override;
  int next_buffer() override { return (buffer_turn_++) & 1; }
  void expect(uint8_t step) override;  // the descriptor of begin()'s operation
  void arrive() override;
  void wait_all() override;
  bool poll_all(int polls) override;
  void arrive_small(const void* data, size_t bytes) override;
  const uint8_t* small_data(int i) const override;
  void begin_work(uint64_t pieces) override;  // shared work (see above)
  int64_t take_piece() override;
  void finish_piece() override;
  void wait_work() override;
  bool cma() const override { return cma_; }
  // More local ranks than cores: waits then yield, not spin.
  bool oversubscribed() const override { return oversubscribed_; }
  bool crowded() const override { return crowded_; }
  // As many local ranks as cores, or more: no core is left for the ranks' progress
  // threads (ProgressEngineBase::set_no_spare_core()).
  bool no_spare_core() const override { return no_spare_core_; }
  void publish_buffers(const void* in, void* out) override;
  uint64_t peer_in(int i) const override;
  void read_peer(int i, uint64_t from, void* to, size_t bytes) override;
  void publish_shared(const shared::SharedRef& send, const shared::SharedRef& recv) override;
  uint8_t* peer_shared(int i, int which) override;

  // Communicator rank of local rank `i`.
  int member(int i) const { return config_.members[i]; }
  // Sets the operation reported in errors; called before every operation.
  void begin(const OpInfo& op);
  // Address of local rank i's published output.
  uint64_t peer_out(int i) const;

  // Local index of communicator rank `rank`, or -1 when it is on another node.
  int local_of(int rank) const;
  // Host name of communicator rank `rank`.
  const std::string& host_of(int rank) const { return config_.hosts.at(rank); }

  // ---- For ShmTransport (shm_transport.h): the streams and the group's waits.
  // A stream slot: `head` (bytes written, in all) only its sender writes, `tail` (bytes
  // read) only the receiver it is bound to; `binding` (pooled slots) says which.
  struct Stream {
    uint64_t* head;
    uint64_t* tail;
    uint8_t* ring;
    size_t capacity;
    uint64_t* binding;
  };
  // Stream slots per local rank; pooled: fewer than its peers, bound on demand
  // (shm_transport.h); otherwise one per peer, stream() below.
  int slots() const { return slot_count_; }
  bool pooled() const { return pooled_; }
  // Slot k (0 <= k < slots()) of local rank `from`.
  Stream slot(int from, int k) const;
  // Not pooled: the stream from local rank `from` to local rank `to`, its slot for good.
  Stream stream(int from, int to) const;
  // Wakes sleepers, if any, after a store they may wait for.
  void notify();
  // Waits as the phases wait (spinning briefly, then napping on the segment's futex)
  // until ready() (true) or `until` (false). Before every nap it calls check(liveness),
  // liveness being true once per kLivenessPeriod; once the operation's deadline has
  // passed, expired(), which must throw.
  bool wait_streams(const std::function<bool()>& ready, const std::function<void(bool)>& check,
                    const std::function<void()>& expired, std::chrono::steady_clock::time_point until);
  // Throws AbortedError after interrupt().
  void check_interrupt();
  // Whether local rank i closed the communicator (and so writes nothing more).
  bool has_closed(int i) const;
  // Throws PeerError when local rank i aborted, or, while this rank waits for it
  // (`waiting`), closed or (with `liveness`) died; `closed` and `died` end the messages.
  void check_peer(int i, bool liveness, bool waiting, const std::string& closed,
                  const std::string& died);
  // Publishes that this rank waits in `call` for the local ranks of `awaited` (a bit
  // each; bit 63 stands for 63 and beyond), until clear_waiting(); read_waiting() reads
  // local rank i's, false when it waits in nothing (or is just changing it).
  void publish_waiting(const OpDesc& call, uint64_t awaited);
  void clear_waiting();
  bool read_waiting(int i, OpDesc& call, uint64_t& awaited) const;
  // "allreduce #7" for the current operation (begin()); "rank 3 (host h)" for local i.
  std::string op_name() const;
  std::string rank_name(int local) const;

  // Thread-safe: the wait in progress (or the next) throws AbortedError.
  void interrupt(const std::string& reason);
  // Tells the local peers that this rank aborted, with `reason`. Idempotent.
  void abort(const std::string& reason);
  // Tells the local peers that this rank left cleanly.
  void close();

 private:
  struct Header;
  struct Control;
  struct Channel;

  ShmGroup(const GroupConfig& config, Segment segment, int local_rank);
  Header& header() const;
  Control& control(int i) const;
  bool all_arrived(uint64_t phase) const;
  // Spins briefly (oversubscribed: yields, spinning a little first when
  // on_my_core(this CPU) says nobody it waits for was last seen on this core) until
  // ready(), then sleeps on the epoch futex, calling check(liveness) before every sleep
  // and expired() once the deadline passed; false when `until` came first (layout.h).
  template <class Ready, class Check, class Expired, class OnMyCore>
  bool wait_until(Ready&& ready, Check&& check, Expired&& expired, OnMyCore&& on_my_core,
                  std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());
  void check_peers(uint64_t phase, bool liveness);
  void check_descriptors();
  void probe_cma(Store& store, const std::string& base);
  [[noreturn]] void fail_read(int i, int err);
  void wake();
  [[noreturn]] void fail_timeout(uint64_t phase) const;
  // TimeoutError naming the local ranks in `awaited`, waited for to `what` (or null).
  [[noreturn]] void fail_timeout_for(const std::vector<int>& awaited, const char* what) const;
  bool work_done() const;

  GroupConfig config_;
  Segment segment_;
  int local_rank_, local_size_;
  uint8_t* data_ = nullptr;
  uint64_t phase_ = 0;
  uint64_t buffer_turn_ = 0;
  // Shared work: the pieces of all rounds so far, the current one's included, and each
  // local rank's share of the current round, as tickets of that rank's counter
  // (Control::taken) and as the index of its first piece.
  uint64_t work_end_ = 0;
  struct Share {
    uint64_t begin = 0, end = 0, first_piece = 0;
  };
  std::vector<Share> shares_;
  OpInfo op_;
  OpDesc desc_;
  uint64_t desc_fp_ = 0;        // fingerprint(desc_)
  bool desc_pending_ = false;   // publish desc_ with the next arrival
  bool check_pending_ = false;  // compare descriptors at the next wait_all
  // More local ranks than cores: a spinning rank would take the core from the one it
  // waits for, so waits yield instead of spinning.
  bool oversubscribed_ = false;
  bool no_spare_core_ = false;
  bool crowded_ = false;
  std::vector<int> pidfds_;     // per local rank; -1 for this process or unavailable
  std::chrono::steady_clock::time_point next_liveness_check_;
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mutex_;
  std::string interrupt_reason_;
  bool left_ = false;
  bool cma_ = false;
  // The stream slots (layout.h: Layout).
  uint8_t* slots_ = nullptr;
  int slot_count_ = 0;          // per local rank
  bool pooled_ = false;
  size_t slot_control_ = 0, ring_bytes_ = 0, slot_stride_ = 0;
  uint64_t probe_cookie_ = 0;   // read by the peers at set-up to try cross-memory attach
  PeerFiles peer_files_;        // the peers' node-shared buffers, mapped
};

}  // namespace chorus::transport::shm
