// The simulator's core: every rank's body as a fiber on this thread, a transport per
// rank whose messages move in virtual time, and the deterministic scheduler between
// them (docs/simulator.md).
//
// Scheduler: one queue of events ordered by (virtual time, order of creation). An
// event resumes a rank (its start, the end of a charged reduction, a wake after an
// error, a wait_for() slice) or completes a send or a receive, which resumes its rank
// when that rank waits for it. A running rank runs at the time of the event that
// resumed it, posts at that time, and runs until it waits for something not complete:
// then the scheduler takes the next event. Nothing sleeps in real time, and the same
// program gives the same events in the same order: the same times, every run.
//
// Matching (as test::FakeHub): per ordered pair of ranks a stream; its n-th send is
// matched with its n-th receive whichever is posted last, and the bytes are copied
// then. Each carries the call of the rank that posted it (OpInfo: kind, code,
// sequence number, signature); a receive matched with another call's send, or of
// another length, fails the receiver with PeerError naming both ranks. Timing
// (network.h): a send completes when its last byte has left and its receive has been
// posted (so an algorithm that needs buffering deadlocks here, as on FakeHub); a
// receive completes when the message is delivered, not before it was posted.
//
// Bounds: when no event is left while some rank waits (a deadlock), or virtual time
// passes Options::max_time, or the run takes longer than Options::wall_limit, every
// waiting rank's wait throws TimeoutError naming the call, the rank and what it still
// waits for (bytes to receive from or send to which ranks). A rank whose body throws
// aborts its transport: its peers' waits on it throw PeerError at once.
// Not bounded: a body that never waits (a loop on test()) keeps the thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "chorus/error.h"
#include "comm/reduce/reduce.h"
#include "comm/sim/fiber.h"
#include "comm/sim/network.h"
#include "comm/transport/call_header.h"
#include "comm/transport/transport.h"

namespace chorus::sim {

struct Options {
  size_t stack_bytes = size_t{256} << 10;  // per rank, virtual: only touched pages count
  double max_time = 1e6;                   // simulated seconds
  std::chrono::milliseconds wall_limit{600000};
};

// What one rank sent, and to how many ranks it talked.
struct RankTraffic {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  uint32_t peers = 0;  // distinct ranks it sent to or received from
  // One-way streams it sent or received on: the sockets the tcp transport, which opens
  // one per direction on first use, would hold for the call.
  uint32_t streams = 0;
};

// A rank's failure: what its body threw.
struct RankFailure {
  int rank = -1;
  ErrorKind kind = ErrorKind::kSystem;
  bool peer_error = false;  // a consequence of another rank's failure
  std::string message;
};

class Engine;

// One rank's chorus::transport::Transport: forwards to the engine. Used only from the
// rank's own fiber.
class SimTransport final : public transport::Transport {
 public:
  SimTransport(Engine& engine, int rank) : e_(engine), rank_(rank) {}

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
  Engine& e_;
  int rank_;
};

class Engine {
 public:
  Engine(int ranks, int ranks_per_node, const LinkModel& model, const Options& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs body(rank) for every rank, each on its fiber, until every one has returned
  // or thrown (see Bounds above). Once only.
  void run(const std::function<void(int)>& body);

  int size() const { return static_cast<int>(ranks_.size()); }
  const Network& network() const { return net_; }
  const LinkModel& model() const { return model_; }
  double now() const { return now_; }
  // Per rank: when its body returned (or threw), and what it sent.
  double end_time(int rank) const { return ranks_[rank].end_time; }
  const RankTraffic& traffic(int rank) const { return ranks_[rank].traffic; }
  const std::vector<RankFailure>& failures() const { return failures_; }
  // Why the run was stopped (a deadlock or a limit), or empty.
  const std::string& stop_reason() const { return stop_reason_; }
  uint64_t events() const { return events_; }
  size_t streams() const { return streams_.size(); }

  // The running rank's reduction kernels (Context::reduce/reduce_many); the charged
  // ones below call them and advance its time by the output bytes / reduce_rate.
  void set_reduce(int rank, ReduceFn fn, ReduceManyFn many, size_t elem);
  static void charged_reduce(void* out, const void* a, const void* b, size_t count);
  static void charged_reduce_many(void* out, const void* const* src, int k, size_t count);

 private:
  friend class SimTransport;
  // A posted send or receive not yet matched; sends: t0 = when it left, t1 = when it
  // is delivered; receives: t0 = when posted. In a per-stream list through `next`.
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Pending {
    uint8_t* data;
    size_t len;
    transport::CallHeader header;
    double t0, t1;
    uint32_t next;
  };
  struct Queue {
    uint32_t head = kNil, tail = kNil;
  };
  struct Stream {
    StreamClock clock;
    Queue sends, recvs;
    uint64_t sends_posted = 0, sends_done = 0, recvs_posted = 0, recvs_done = 0;
  };
  enum class Phase : uint8_t { kReady, kRunning, kWaiting, kSleeping, kFinished };
  // What a waiting rank waits for: every request it posted, or one.
  struct Target {
    bool all = true;
    bool send = false;
    Stream* stream = nullptr;
    uint64_t index = 0;
  };
  struct Rank {
    std::unique_ptr<Fiber> fiber;
    Phase phase = Phase::kReady;
    uint32_t gen = 0;  // counts suspensions: a resume event is for one of them
    Target target;
    uint64_t outstanding = 0;  // posted requests not complete
    double end_time = 0;
    transport::OpInfo op;
    std::string failure, interrupt, left, stuck;
    RankTraffic traffic;
    ReduceFn reduce = nullptr;
    ReduceManyFn reduce_many = nullptr;
    size_t elem = 0;
  };
  enum class EventKind : uint8_t { kResume, kSendDone, kRecvDone };
  struct Event {
    double time;
    uint64_t order;
    Stream* stream;
    int32_t rank;
    uint32_t gen;
    EventKind kind;
    bool operator>(const Event& o) const {
      return time != o.time ? time > o.time : order > o.order;
    }
  };

  // ---- the transport's operations, for `rank` (the running one)
  transport::Request post(int rank, int peer, uint8_t* data, size_t len, bool send);
  bool done(int rank, const transport::Request& r) const;
  // Waits until `target` is complete (true) or virtual time `until` (false).
  bool wait(int rank, const Target& target, double until);
  Target target_of(int rank, const transport::Request& r);
  void interrupt(int rank, const std::string& reason);
  void leave(int rank, const std::string& why);

  // ---- streams and matching
  Stream& stream(int from, int to);
  uint32_t push(Queue& q, const Pending& p);
  Pending pop(Queue& q);
  void match(Stream& s, int from, int to);

  // ---- scheduling
  void schedule(double time, EventKind kind, int rank, Stream* s = nullptr, uint32_t gen = 0);
  void dispatch(const Event& e);
  void resume(int rank);
  void suspend(int rank, Phase phase);
  bool satisfied(const Rank& r) const;
  void maybe_resume(int rank);
  void sleep(int rank, double seconds);
  void fail(int rank, const std::string& what);
  static void fiber_main(void* arg);
  void run_rank(int rank);

  // ---- bounds
  void stop(const std::string& why);
  void describe_stuck();
  std::string label(int rank) const;  // "allreduce #3"
  std::string here(int rank) const;   // "rank 5 (host node1)"

  LinkModel model_;
  Options options_;
  Network net_;
  std::vector<Rank> ranks_;
  std::vector<std::string> hosts_;  // per node
  std::unordered_map<uint64_t, Stream> streams_;  // key from * size + to, made on first use
  uint64_t last_key_ = UINT64_MAX;  // the stream stream() returned last
  Stream* last_stream_ = nullptr;
  std::vector<Pending> pool_;
  std::vector<uint32_t> free_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_queue_;
  uint64_t order_ = 0, events_ = 0;
  double now_ = 0;
  int current_ = -1;
  int finished_ = 0;
  std::string stop_reason_;
  std::vector<RankFailure> failures_;
  const std::function<void(int)>* body_ = nullptr;
};

}  // namespace chorus::sim
