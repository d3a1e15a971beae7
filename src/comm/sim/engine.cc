#include "comm/sim/engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "chorus/error.h"

namespace chorus::sim {

using transport::OpInfo;
using transport::Request;

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
// The engine whose fibers run on this thread (charged reductions find it here).
thread_local Engine* t_running = nullptr;

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

}  // namespace

// ---- SimTransport: every call forwarded to the engine for this rank.

int SimTransport::size() const { return e_.size(); }
const std::string& SimTransport::host_of(int rank) const {
  return e_.hosts_.at(e_.net_.node_of(rank));
}
void SimTransport::begin(const OpInfo& op) { e_.ranks_[rank_].op = op; }
Request SimTransport::isend(int peer, const void* data, size_t len) {
  return e_.post(rank_, peer, static_cast<uint8_t*>(const_cast<void*>(data)), len, true);
}
Request SimTransport::irecv(int peer, void* data, size_t len) {
  return e_.post(rank_, peer, static_cast<uint8_t*>(data), len, false);
}
void SimTransport::wait(const Request& request) {
  e_.wait(rank_, e_.target_of(rank_, request), kNever);
}
bool SimTransport::test(const Request& request) const { return e_.done(rank_, request); }
void SimTransport::wait_all() { e_.wait(rank_, Engine::Target{}, kNever); }
bool SimTransport::wait_for(const Request* request, std::chrono::microseconds slice) {
  const Engine::Target target = request ? e_.target_of(rank_, *request) : Engine::Target{};
  return e_.wait(rank_, target, e_.now_ + static_cast<double>(slice.count()) * 1e-6);
}
void SimTransport::interrupt(const std::string& reason) { e_.interrupt(rank_, reason); }
void SimTransport::abort(const std::string& reason) {
  e_.leave(rank_, rank_name(rank_) + " aborted: " + reason);
}
void SimTransport::close() { e_.leave(rank_, rank_name(rank_) + " left the communicator"); }

// ---- Engine

Engine::Engine(int ranks, int ranks_per_node, const LinkModel& model, const Options& options)
    : model_(model), options_(options), net_(model, ranks, ranks_per_node), ranks_(ranks) {
  if (ranks < 1 || ranks_per_node < 1) {
    throw InvalidArgumentError("simulator: " + std::to_string(ranks) + " ranks, " +
                               std::to_string(ranks_per_node) + " per node");
  }
  for (int n = 0; n < net_.nodes(); ++n) hosts_.push_back("node" + std::to_string(n));
}

Engine::~Engine() = default;

std::string Engine::label(int rank) const {
  const OpInfo& op = ranks_[rank].op;
  return std::string(op.name) + " #" + std::to_string(op.seq);
}

std::string Engine::here(int rank) const {
  return rank_name(rank) + " (host " + hosts_[net_.node_of(rank)] + ")";
}

Engine::Stream& Engine::stream(int from, int to) {
  const uint64_t n = ranks_.size();
  const uint64_t key = static_cast<uint64_t>(from) * n + to;
  if (key == last_key_) return *last_stream_;  // a post, then its wait
  auto [it, made] = streams_.try_emplace(key);
  last_key_ = key;
  last_stream_ = &it->second;
  if (made && from != to) {
    ++ranks_[from].traffic.streams;
    ++ranks_[to].traffic.streams;
  }
  if (made && from != to && streams_.find(static_cast<uint64_t>(to) * n + from) == streams_.end()) {
    ++ranks_[from].traffic.peers;  // the first stream between the two, either way
    ++ranks_[to].traffic.peers;
  }
  return it->second;
}

uint32_t Engine::push(Queue& q, const Pending& p) {
  uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
    pool_[i] = p;
  } else {
    i = static_cast<uint32_t>(pool_.size());
    pool_.push_back(p);
  }
  pool_[i].next = kNil;
  if (q.tail != kNil) pool_[q.tail].next = i;
  else q.head = i;
  q.tail = i;
  return i;
}

Engine::Pending Engine::pop(Queue& q) {
  const uint32_t i = q.head;
  Pending p = pool_[i];
  q.head = p.next;
  if (q.head == kNil) q.tail = kNil;
  free_.push_back(i);
  return p;
}

Request Engine::post(int rank, int peer, uint8_t* data, size_t len, bool send) {
  Rank& me = ranks_[rank];
  if (peer < 0 || peer >= size()) {
    throw InvalidArgumentError("simulator: " + std::string(send ? "isend to " : "irecv from ") +
                               rank_name(peer) + " on " + rank_name(rank) + " of " +
                               std::to_string(size()));
  }
  if (!me.left.empty()) {
    throw AbortedError(label(rank) + " on " + here(rank) + ": the transport is closed");
  }
  const transport::CallHeader h = transport::CallHeader::of(me.op);
  Stream& s = send ? stream(rank, peer) : stream(peer, rank);
  Request r{peer, send, 0};
  if (send) {
    const Departure d = net_.send(rank, peer, len, now_, s.clock);
    push(s.sends, Pending{data, len, h, d.left, d.delivered, kNil});
    r.index = s.sends_posted++;
    me.traffic.messages += 1;
    me.traffic.bytes += len;
  } else {
    push(s.recvs, Pending{data, len, h, now_, 0, kNil});
    r.index = s.recvs_posted++;
  }
  ++me.outstanding;
  if (!ranks_[peer].left.empty()) fail(rank, ranks_[peer].left);
  if (send) match(s, rank, peer);
  else match(s, peer, rank);
  return r;
}

void Engine::match(Stream& s, int from, int to) {
  while (s.sends.head != kNil && s.recvs.head != kNil) {
    const Pending send = pop(s.sends), recv = pop(s.recvs);
    // The bytes went out, whatever the receiver makes of them.
    schedule(std::max(send.t0, recv.t0), EventKind::kSendDone, from, &s);
    const transport::CallHeader& w = recv.header;
    const std::string what =
        transport::call_mismatch(send.header, send.len, w, recv.len, from, here(from));
    if (!what.empty()) {
      fail(to, std::string(w.name) + " #" + std::to_string(w.seq) + " failed on " + here(to) +
                   ": " + what);
      return;  // the stream is broken: this receive never completes
    }
    if (send.len > 0) std::memcpy(recv.data, send.data, send.len);
    schedule(std::max(send.t1, recv.t0), EventKind::kRecvDone, to, &s);
  }
}

bool Engine::done(int rank, const Request& r) const {
  const uint64_t n = ranks_.size();
  const uint64_t key = r.is_send ? static_cast<uint64_t>(rank) * n + r.peer
                                 : static_cast<uint64_t>(r.peer) * n + rank;
  auto it = streams_.find(key);
  if (it == streams_.end()) return false;
  return r.is_send ? it->second.sends_done > r.index : it->second.recvs_done > r.index;
}

Engine::Target Engine::target_of(int rank, const Request& r) {
  if (r.peer < 0 || r.peer >= size()) {
    throw InvalidArgumentError("simulator: wait on a request of " + rank_name(r.peer));
  }
  Stream& s = r.is_send ? stream(rank, r.peer) : stream(r.peer, rank);
  return Target{false, r.is_send, &s, r.index};
}

bool Engine::satisfied(const Rank& r) const {
  const Target& t = r.target;
  if (t.all) return r.outstanding == 0;
  return t.send ? t.stream->sends_done > t.index : t.stream->recvs_done > t.index;
}

bool Engine::wait(int rank, const Target& target, double until) {
  Rank& me = ranks_[rank];
  me.target = target;
  for (;;) {
    if (!me.interrupt.empty()) {
      throw AbortedError(label(rank) + " on " + here(rank) + " was aborted: " + me.interrupt);
    }
    if (!me.failure.empty()) throw PeerError(me.failure);
    if (satisfied(me)) return true;
    if (!stop_reason_.empty()) throw TimeoutError(me.stuck.empty() ? stop_reason_ : me.stuck);
    if (now_ >= until) return false;
    if (until < kNever) schedule(until, EventKind::kResume, rank, nullptr, me.gen + 1);
    suspend(rank, Phase::kWaiting);
  }
}

void Engine::interrupt(int rank, const std::string& reason) {
  if (ranks_[rank].interrupt.empty()) ranks_[rank].interrupt = reason;
  if (ranks_[rank].phase == Phase::kWaiting) schedule(now_, EventKind::kResume, rank, nullptr, ranks_[rank].gen);
}

void Engine::fail(int rank, const std::string& what) {
  Rank& r = ranks_[rank];
  if (r.failure.empty()) r.failure = what;
  if (r.phase == Phase::kWaiting) schedule(now_, EventKind::kResume, rank, nullptr, r.gen);
}

// Drops the rank's unmatched posts and fails every peer that still waits on it. Scans
// every stream: a rank leaves once.
void Engine::leave(int rank, const std::string& why) {
  Rank& me = ranks_[rank];
  if (!me.left.empty()) return;
  me.left = why;
  if (!stop_reason_.empty()) return;  // stopped: every wait throws anyway
  const uint64_t n = ranks_.size();
  for (auto& [key, s] : streams_) {
    const int from = static_cast<int>(key / n), to = static_cast<int>(key % n);
    if (from == rank) {
      while (s.sends.head != kNil) pop(s.sends);
      if (s.recvs_done < s.recvs_posted) fail(to, label(to) + " failed on " + here(to) + ": " + why);
    }
    if (to == rank) {
      while (s.recvs.head != kNil) pop(s.recvs);
      if (s.sends_done < s.sends_posted) fail(from, label(from) + " failed on " + here(from) + ": " + why);
    }
  }
}

// ---- scheduling

void Engine::schedule(double time, EventKind kind, int rank, Stream* s, uint32_t gen) {
  events_queue_.push(Event{time, order_++, s, rank, gen, kind});
}

void Engine::suspend(int rank, Phase phase) {
  Rank& me = ranks_[rank];
  ++me.gen;
  me.phase = phase;
  me.fiber->suspend();
}

void Engine::resume(int rank) {
  Rank& me = ranks_[rank];
  current_ = rank;
  me.phase = Phase::kRunning;
  me.fiber->resume();
  current_ = -1;
  if (me.fiber->finished()) {
    me.phase = Phase::kFinished;
    me.fiber.reset();  // unmaps its stack
    ++finished_;
  }
}

void Engine::maybe_resume(int rank) {
  if (ranks_[rank].phase == Phase::kWaiting && satisfied(ranks_[rank])) resume(rank);
}

void Engine::sleep(int rank, double seconds) {
  if (seconds <= 0) return;
  schedule(now_ + seconds, EventKind::kResume, rank, nullptr, ranks_[rank].gen + 1);
  suspend(rank, Phase::kSleeping);
}

void Engine::dispatch(const Event& e) {
  Rank& r = ranks_[e.rank];
  switch (e.kind) {
    case EventKind::kResume:
      if (r.phase != Phase::kFinished && r.phase != Phase::kRunning && e.gen == r.gen) resume(e.rank);
      return;
    case EventKind::kSendDone:
      ++e.stream->sends_done;
      break;
    case EventKind::kRecvDone:
      ++e.stream->recvs_done;
      break;
  }
  --r.outstanding;
  maybe_resume(e.rank);
}

void Engine::fiber_main(void* arg) {
  auto* e = static_cast<Engine*>(arg);
  e->run_rank(e->current_);
}

// The fiber's body: never lets an exception out.
void Engine::run_rank(int rank) {
  try {
    (*body_)(rank);
  } catch (const std::exception& ex) {
    const auto* err = dynamic_cast<const Error*>(&ex);
    failures_.push_back(RankFailure{rank, err ? err->kind() : ErrorKind::kSystem,
                                    dynamic_cast<const PeerError*>(&ex) != nullptr, ex.what()});
    leave(rank, rank_name(rank) + " aborted: this rank failed");
  }
  ranks_[rank].end_time = now_;
}

void Engine::run(const std::function<void(int)>& body) {
  body_ = &body;
  Engine* outer = t_running;
  t_running = this;
  for (int r = 0; r < size(); ++r) {
    ranks_[r].fiber = std::make_unique<Fiber>(options_.stack_bytes, &Engine::fiber_main, this);
    schedule(0, EventKind::kResume, r);
  }
  const auto wall_end = std::chrono::steady_clock::now() + options_.wall_limit;
  int stops = 0;
  while (finished_ < size()) {
    if (events_queue_.empty()) {
      if (stops++ > 0) break;  // the ranks went on waiting after their waits threw
      std::ostringstream m;
      m << "simulated deadlock at " << now_ << " s: every unfinished rank waits and no message "
        << "is in flight";
      stop(m.str());
      continue;
    }
    const Event e = events_queue_.top();
    events_queue_.pop();
    if (stop_reason_.empty() && e.time > options_.max_time) {
      stop("simulated time passed the limit of " + std::to_string(options_.max_time) + " s");
      continue;
    }
    if (stop_reason_.empty() && (events_ & 1023) == 0 && std::chrono::steady_clock::now() > wall_end) {
      stop("the simulation ran past its wall-clock limit of " +
           std::to_string(options_.wall_limit.count()) + " ms");
      continue;
    }
    now_ = e.time;
    ++events_;
    dispatch(e);
  }
  t_running = outer;
}

// ---- bounds

void Engine::stop(const std::string& why) {
  stop_reason_ = why;
  events_queue_ = {};
  describe_stuck();
  for (int r = 0; r < size(); ++r) {
    const Phase p = ranks_[r].phase;
    if (p == Phase::kWaiting || p == Phase::kSleeping) resume(r);
  }
}

// Fills Rank::stuck of every waiting rank: its call and, from one pass over the
// streams, the first few transfers it waits for.
void Engine::describe_stuck() {
  constexpr size_t kShown = 4;
  std::map<int, std::vector<std::string>> waits;
  std::map<int, std::vector<int>> awaited;
  const uint64_t n = ranks_.size();
  auto note = [&](int rank, int peer, const std::string& what) {
    if (ranks_[rank].phase != Phase::kWaiting) return;
    awaited[rank].push_back(peer);
    if (waits[rank].size() < kShown) waits[rank].push_back(what);
  };
  for (const auto& [key, s] : streams_) {
    const int from = static_cast<int>(key / n), to = static_cast<int>(key % n);
    if (s.recvs_done < s.recvs_posted && s.recvs.head != kNil) {
      note(to, from, "to receive " + std::to_string(pool_[s.recvs.head].len) + " bytes from " +
                         rank_name(from));
    }
    if (s.sends_done < s.sends_posted && s.sends.head != kNil) {
      note(from, to, "to send " + std::to_string(pool_[s.sends.head].len) + " bytes to " +
                         rank_name(to) + " (not received)");
    }
  }
  for (int r = 0; r < size(); ++r) {
    if (ranks_[r].phase != Phase::kWaiting) continue;
    std::vector<int>& peers = awaited[r];
    std::sort(peers.begin(), peers.end());
    std::ostringstream m;
    m << label(r) << " timed out on " << here(r) << ": " << stop_reason_ << "; still waiting";
    for (const std::string& w : waits[r]) m << " " << w << ";";
    if (peers.size() > kShown) m << " and " << peers.size() - kShown << " more;";
    if (peers.empty()) m << " for nothing it posted (a wait on a request of another rank?)";
    ranks_[r].stuck = m.str();
  }
}

// ---- charged reductions

void Engine::set_reduce(int rank, ReduceFn fn, ReduceManyFn many, size_t elem) {
  ranks_[rank].reduce = fn;
  ranks_[rank].reduce_many = many;
  ranks_[rank].elem = elem;
}

void Engine::charged_reduce(void* out, const void* a, const void* b, size_t count) {
  Engine& e = *t_running;
  const Rank& r = e.ranks_[e.current_];
  r.reduce(out, a, b, count);
  e.sleep(e.current_, static_cast<double>(count * r.elem) / e.model_.reduce_rate);
}

void Engine::charged_reduce_many(void* out, const void* const* src, int k, size_t count) {
  Engine& e = *t_running;
  const Rank& r = e.ranks_[e.current_];
  r.reduce_many(out, src, k, count);
  const double bytes = static_cast<double>(count * r.elem) * (k - 1);
  e.sleep(e.current_, bytes / e.model_.reduce_rate);
}

}  // namespace chorus::sim
