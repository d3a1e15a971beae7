// How ShmGroup finds out about its peers and names them: liveness (pidfds, /proc),
// aborts and clean leaves, the descriptors that disagree, timeouts naming the ranks
// awaited, and what a rank waiting in the streams publishes for its peers.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "chorus/error.h"
#include "comm/transport/shm/layout.h"
#include "comm/transport/shm/shm_group.h"

namespace chorus::transport::shm {
namespace {

// /proc/<pid>/stat's state: a zombie has exited but is not reaped yet.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return true;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* close_paren = std::strrchr(buf, ')');
  return n > 0 && close_paren != nullptr && close_paren[1] == ' ' && close_paren[2] == 'Z';
}

}  // namespace

void ShmGroup::check_interrupt() {
  if (interrupted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    throw AbortedError(op_name() + " on " + rank_name(local_rank_) + " was aborted: " + interrupt_reason_);
  }
}

bool ShmGroup::has_closed(int i) const {
  return atomic(control(i).state).load(std::memory_order_acquire) == kClosed;
}

void ShmGroup::check_peer(int i, bool liveness, bool waiting, const std::string& closed,
                          const std::string& died) {
  Control& c = control(i);
  uint32_t state = atomic(c.state).load(std::memory_order_acquire);
  if (state == kAborted) {
    std::string reason(c.reason, strnlen(c.reason, kReasonBytes));
    throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": " + rank_name(i) +
                    " aborted: " + reason);
  }
  if (!waiting) return;
  if (state == kClosed) {
    throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": " + rank_name(i) + " " + closed);
  }
  if (!liveness) return;
  bool gone = false;
  if (pidfds_[i] >= 0) {
    struct pollfd p = {pidfds_[i], POLLIN, 0};
    gone = ::poll(&p, 1, 0) > 0;
  } else if (c.pid != getpid()) {
    gone = process_gone(c.pid);
  }
  if (gone) {
    std::string who = rank_name(i);
    who.insert(who.size() - 1, ", pid " + std::to_string(c.pid));
    throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": " + who +
                    " died: its process exited or was killed " + died);
  }
}

void ShmGroup::check_peers(uint64_t phase, bool liveness) {
  check_interrupt();
  for (int i = 0; i < local_size_; ++i) {
    if (i == local_rank_) continue;
    const bool waiting_for_it = atomic(control(i).arrived).load(std::memory_order_acquire) < phase;
    check_peer(i, liveness, waiting_for_it, "closed the communicator without calling this operation",
               "while this rank waited for it in shared memory");
  }
}

void ShmGroup::check_descriptors() {
  const int parity = static_cast<int>(phase_ & 1);
  for (int i = 0; i < local_size_; ++i) {
    if (control(i).fp[parity] == desc_fp_) continue;
    const OpDesc& theirs = control(i).desc[parity];
    if (theirs == desc_) continue;
    auto call = [](const OpDesc& d) { return describe_call(d.code, nullptr, d.seq, false, d.sig); };
    std::string m = op_name() + " failed on " + rank_name(local_rank_) + ": ";
    if (theirs.code == desc_.code && theirs.seq == desc_.seq && theirs.sig == desc_.sig &&
        (theirs.step ^ desc_.step) == kSharedStep) {
      auto buffers = [](const OpDesc& d) {
        return (d.step & kSharedStep) != 0 ? "node-shared buffers (allocate_shared)" : "ordinary buffers";
      };
      throw PeerError(m + rank_name(i) + " passed " + buffers(theirs) + " to it where this rank passed " +
                      buffers(desc_) + "; every rank of a node must pass the same kind (shared_memory.h)");
    }
    if (theirs.code == desc_.code && theirs.seq == desc_.seq && theirs.sig == desc_.sig) {
      // The same call, run differently (forced algorithms that differ between ranks).
      throw PeerError(m + rank_name(i) + " ran " + op_code_name(theirs.step) +
                      " in shared memory for it where this rank ran " + op_code_name(desc_.step));
    }
    throw PeerError(m + mismatch_text(rank_name(i), config_.members[i], call(theirs), call(desc_)));
  }
}

void ShmGroup::fail_timeout(uint64_t phase) const {
  std::vector<int> awaited;
  for (int i = 0; i < local_size_; ++i) {
    if (atomic(control(i).arrived).load() < phase) awaited.push_back(i);
  }
  fail_timeout_for(awaited, nullptr);
}

void ShmGroup::fail_timeout_for(const std::vector<int>& awaited, const char* what) const {
  std::ostringstream m;
  m << op_name() << " timed out on " << rank_name(local_rank_)
    << " waiting in shared memory for:";
  std::vector<int> ranks;
  for (int i : awaited) {
    m << " " << rank_name(i) << ";";
    ranks.push_back(config_.members[i]);
  }
  std::sort(ranks.begin(), ranks.end());
  m << " (";
  if (what != nullptr) m << "to " << what << "; ";
  m << "a peer is stopped, hung, or behind in a different operation)";
  throw TimeoutError(m.str(), std::move(ranks));
}

std::string ShmGroup::op_name() const {
  return std::string(op_.name) + " #" + std::to_string(op_.seq);
}

std::string ShmGroup::rank_name(int local) const {
  int r = config_.members[local];
  const std::string& host = static_cast<size_t>(r) < config_.hosts.size() ? config_.hosts[r] : "?";
  return "rank " + std::to_string(r) + " (host " + host + ")";
}

void ShmGroup::interrupt(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    if (interrupted_.load()) return;
    interrupt_reason_ = reason;
  }
  interrupted_.store(true, std::memory_order_release);
  wake();
}

void ShmGroup::abort(const std::string& reason) {
  if (left_) return;
  left_ = true;
  Control& mine = control(local_rank_);
  size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(mine.reason, reason.data(), n);
  mine.reason[n] = '\0';
  atomic(mine.state).store(kAborted, std::memory_order_release);
  wake();
}

void ShmGroup::close() {
  if (left_) return;
  left_ = true;
  atomic(control(local_rank_).state).store(kClosed, std::memory_order_release);
  wake();
}

// A sequence lock: the owner makes the version odd, writes, makes it even again; a
// reader keeps what it read only when the version was even and unchanged around it.
// Every word goes through atomic loads and stores, since both sides touch it at once.
void ShmGroup::publish_waiting(const OpDesc& call, uint64_t awaited) {
  static_assert(sizeof(OpDesc) <= sizeof(Control::waiting_call));
  Control& mine = control(local_rank_);
  uint64_t words[sizeof(Control::waiting_call) / sizeof(uint64_t)] = {};
  std::memcpy(words, &call, sizeof call);
  const uint64_t v = atomic(mine.waiting_version).load(std::memory_order_relaxed);
  atomic(mine.waiting_version).store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t k = 0; k < std::size(words); ++k) atomic(mine.waiting_call[k]).store(words[k], std::memory_order_relaxed);
  atomic(mine.waiting_for).store(awaited, std::memory_order_relaxed);
  atomic(mine.waiting).store(1, std::memory_order_relaxed);
  atomic(mine.waiting_version).store(v + 2, std::memory_order_release);
}

void ShmGroup::clear_waiting() {
  Control& mine = control(local_rank_);
  if (atomic(mine.waiting).load(std::memory_order_relaxed) == 0) return;  // only this rank writes it
  const uint64_t v = atomic(mine.waiting_version).load(std::memory_order_relaxed);
  atomic(mine.waiting_version).store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  atomic(mine.waiting).store(0, std::memory_order_relaxed);
  atomic(mine.waiting_version).store(v + 2, std::memory_order_release);
}

bool ShmGroup::read_waiting(int i, OpDesc& call, uint64_t& awaited) const {
  Control& c = control(i);
  const uint64_t before = atomic(c.waiting_version).load(std::memory_order_acquire);
  if (before & 1) return false;
  uint64_t words[sizeof(Control::waiting_call) / sizeof(uint64_t)];
  for (size_t k = 0; k < std::size(words); ++k) words[k] = atomic(c.waiting_call[k]).load(std::memory_order_relaxed);
  awaited = atomic(c.waiting_for).load(std::memory_order_relaxed);
  const uint64_t waiting = atomic(c.waiting).load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (waiting != 1 || atomic(c.waiting_version).load(std::memory_order_relaxed) != before) return false;
  std::memcpy(&call, words, sizeof call);
  return true;
}

}  // namespace chorus::transport::shm
