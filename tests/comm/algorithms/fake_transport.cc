#include "fake_transport.h"

#include <cstring>
#include <sstream>

#include "chorus/error.h"

namespace chorus::test {

using transport::FrameKind;
using transport::OpInfo;
using transport::Request;

namespace {

std::string rank_name(int rank) { return "rank " + std::to_string(rank); }

std::string op_label(const char* name, uint64_t seq) {
  return std::string(name) + " #" + std::to_string(seq);
}

}  // namespace

// ---- FakeTransport: one rank's side, every call forwarded to the hub under its lock.

FakeTransport::FakeTransport(FakeHub& hub, int rank) : hub_(hub), rank_(rank) {}

int FakeTransport::size() const { return hub_.size_; }

const std::string& FakeTransport::host_of(int rank) const { return hub_.hosts_.at(rank); }

void FakeTransport::begin(const OpInfo& op) { op_ = op; }

Request FakeTransport::isend(int peer, const void* data, size_t len) {
  if (peer < 0 || peer >= hub_.size_) {
    throw InvalidArgumentError("fake transport: isend to rank " + std::to_string(peer));
  }
  std::lock_guard<std::mutex> lock(hub_.mu_);
  FakeHub::RankState& me = hub_.ranks_[rank_];
  if (!me.left.empty()) {
    throw AbortedError(op_label(op_.name, op_.seq) + " on " + rank_name(rank_) +
                       ": the transport is closed");
  }
  FakeHub::Stream& s = hub_.stream(rank_, peer);
  const FakeHub::Header h = FakeHub::Header::of(op_);
  s.sends.push_back({static_cast<const uint8_t*>(data), len, h});
  Request request{peer, true, s.sends_posted++};
  me.traffic.messages += 1;
  me.traffic.bytes += len;
  me.traffic.messages_to[peer] += 1;
  hub_.match(rank_, peer);
  return request;
}

Request FakeTransport::irecv(int peer, void* data, size_t len) {
  if (peer < 0 || peer >= hub_.size_) {
    throw InvalidArgumentError("fake transport: irecv from rank " + std::to_string(peer));
  }
  std::lock_guard<std::mutex> lock(hub_.mu_);
  if (!hub_.ranks_[rank_].left.empty()) {
    throw AbortedError(op_label(op_.name, op_.seq) + " on " + rank_name(rank_) +
                       ": the transport is closed");
  }
  FakeHub::Stream& s = hub_.stream(peer, rank_);
  const FakeHub::Header h = FakeHub::Header::of(op_);
  s.recvs.push_back({static_cast<uint8_t*>(data), len, h});
  Request request{peer, false, s.recvs_posted++};
  hub_.match(peer, rank_);
  return request;
}

void FakeTransport::wait(const Request& request) {
  hub_.wait_for(rank_, op_, [&] { return hub_.done(rank_, request); });
}

bool FakeTransport::test(const Request& request) const {
  std::lock_guard<std::mutex> lock(hub_.mu_);
  return hub_.done(rank_, request);
}

bool FakeTransport::all_done() const {
  for (int p = 0; p < hub_.size_; ++p) {
    const FakeHub::Stream& out = hub_.stream(rank_, p);
    const FakeHub::Stream& in = hub_.stream(p, rank_);
    if (out.sends_done != out.sends_posted || in.recvs_done != in.recvs_posted) return false;
  }
  return true;
}

void FakeTransport::wait_all() {
  hub_.wait_for(rank_, op_, [&] { return all_done(); });
}

bool FakeTransport::wait_for(const Request* request, std::chrono::microseconds slice) {
  const auto until = std::chrono::steady_clock::now() + slice;
  if (request != nullptr) {
    return hub_.wait_for(rank_, op_, [&] { return hub_.done(rank_, *request); }, until);
  }
  return hub_.wait_for(rank_, op_, [&] { return all_done(); }, until);
}

void FakeTransport::interrupt(const std::string& reason) {
  std::lock_guard<std::mutex> lock(hub_.mu_);
  if (hub_.ranks_[rank_].interrupt.empty()) hub_.ranks_[rank_].interrupt = reason;
  hub_.wake_[rank_].notify_all();
}

void FakeTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(hub_.mu_);
  FakeHub::RankState& me = hub_.ranks_[rank_];
  if (!me.left.empty()) return;
  me.left = rank_name(rank_) + " aborted: " + reason;
  for (int p = 0; p < hub_.size_; ++p) {  // pending requests are dropped
    hub_.stream(rank_, p).sends.clear();
    hub_.stream(p, rank_).recvs.clear();
  }
  for (std::condition_variable& cv : hub_.wake_) cv.notify_all();
}

void FakeTransport::close() {
  std::lock_guard<std::mutex> lock(hub_.mu_);
  FakeHub::RankState& me = hub_.ranks_[rank_];
  if (!me.left.empty()) return;
  me.left = rank_name(rank_) + " left the communicator";
  for (int p = 0; p < hub_.size_; ++p) {
    hub_.stream(rank_, p).sends.clear();
    hub_.stream(p, rank_).recvs.clear();
  }
  for (std::condition_variable& cv : hub_.wake_) cv.notify_all();
}

// ---- FakeHub

FakeHub::FakeHub(int size)
    : size_(size), wake_(size), streams_(static_cast<size_t>(size) * size), ranks_(size) {
  for (int r = 0; r < size; ++r) {
    transports_.push_back(std::make_unique<FakeTransport>(*this, r));
    hosts_.push_back("fake" + std::to_string(r));
    ranks_[r].traffic.messages_to.assign(size, 0);
  }
}

Traffic FakeHub::traffic(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_.at(rank).traffic;
}

void FakeHub::reset_traffic() {
  std::lock_guard<std::mutex> lock(mu_);
  for (RankState& r : ranks_) r.traffic = Traffic{0, 0, std::vector<uint64_t>(size_, 0)};
}

void FakeHub::match(int from, int to) {
  Stream& s = stream(from, to);
  if (s.sends.empty() || s.recvs.empty()) return;
  wake_[from].notify_all();  // under mu_: both see the change once they hold it
  wake_[to].notify_all();
  while (!s.sends.empty() && !s.recvs.empty()) {
    const Send send = s.sends.front();
    const Recv recv = s.recvs.front();
    s.sends.pop_front();
    s.recvs.pop_front();
    ++s.sends_done;  // the bytes went out, whatever the receiver makes of them
    const Header& w = recv.header;
    const std::string what = transport::call_mismatch(send.header, send.len, w, recv.len, from,
                                                      rank_name(from) + " (host " + hosts_[from] + ")");
    if (!what.empty()) {
      std::string& failure = ranks_[to].failure;
      if (failure.empty()) {
        failure = op_label(w.name, w.seq) + " failed on " + rank_name(to) + " (host " +
                  hosts_[to] + "): " + what;
      }
      return;  // the stream is broken; the receiver's transport is unusable
    }
    if (send.len > 0) std::memcpy(recv.data, send.data, send.len);
    ++s.recvs_done;
  }
}

bool FakeHub::done(int rank, const Request& request) const {
  if (request.is_send) return stream(rank, request.peer).sends_done > request.index;
  return stream(request.peer, rank).recvs_done > request.index;
}

int FakeHub::departed_peer(int rank) const {
  for (int p = 0; p < size_; ++p) {
    if (ranks_[p].left.empty()) continue;
    const Stream& out = stream(rank, p);
    const Stream& in = stream(p, rank);
    if (out.sends_done != out.sends_posted || in.recvs_done != in.recvs_posted) return p;
  }
  return -1;
}

template <typename Complete>
bool FakeHub::wait_for(int rank, const OpInfo& op, Complete complete,
                       std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  RankState& me = ranks_[rank];
  const std::string here = rank_name(rank) + " (host " + hosts_[rank] + ")";
  for (;;) {
    if (!me.interrupt.empty()) {
      throw AbortedError(op_label(op.name, op.seq) + " on " + here + " was aborted: " +
                         me.interrupt);
    }
    if (!me.failure.empty()) throw PeerError(me.failure);
    if (complete()) return true;
    if (int p = departed_peer(rank); p >= 0) {
      me.failure = op_label(op.name, op.seq) + " failed on " + here + ": " + ranks_[p].left;
      throw PeerError(me.failure);
    }
    if (op.deadline.expired()) break;
    if (std::chrono::steady_clock::now() >= until) return false;
    wake_[rank].wait_until(lock, std::min(until, op.deadline.time_point()));
  }
  std::ostringstream m;
  m << op_label(op.name, op.seq) << " timed out on " << here << "; still waiting:";
  std::vector<int> awaited;
  for (int p = 0; p < size_; ++p) {
    const Stream& in = stream(p, rank);
    const Stream& out = stream(rank, p);
    const bool receiving = in.recvs_done != in.recvs_posted;
    const bool sending = out.sends_done != out.sends_posted;
    if (!receiving && !sending) continue;
    awaited.push_back(p);
    if (receiving && !in.recvs.empty()) {
      m << " to receive " << in.recvs.front().len << " bytes from " << rank_name(p) << ";";
    }
    if (sending && !out.sends.empty()) {
      m << " to send " << out.sends.front().len << " bytes to " << rank_name(p)
        << " (not reading);";
    }
  }
  m << " (a peer is stopped, hung, or behind in a different operation)";
  throw TimeoutError(m.str(), std::move(awaited));
}

}  // namespace chorus::test
