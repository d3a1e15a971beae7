// ShmGroup's phases (arrive, wait_all, the descriptors compared at a phase) and its
// shared work (pieces taken from counters in the segment), and the waits that the
// streams borrow (wait_streams).
#include <sched.h>

#include <cstring>

#include <vector>

#include "chorus/error.h"
#include "comm/common/blocks.h"
#include "comm/transport/shm/layout.h"
#include "comm/transport/shm/shm_group.h"

namespace chorus::transport::shm {

namespace {

// A 64-bit digest of a descriptor: what the phases compare (check_descriptors()), read
// with the arrival in one cache line; the descriptors themselves only when the digests
// differ, to say how. Two different calls that digest alike (a chance of 2^-64) would
// not be told apart.
uint64_t fingerprint(const OpDesc& d) {
  auto mix = [](uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 29);
  };
  uint64_t h = mix(0x6368'6f72'7573ULL, d.seq);
  h = mix(h, d.sig.count);
  h = mix(h, static_cast<uint32_t>(d.sig.root));
  h = mix(h, (uint64_t{d.sig.dtype} << 24) | (uint64_t{d.sig.reduce} << 16) | (uint64_t{d.code} << 8) | d.step);
  return h;
}

}  // namespace

void ShmGroup::begin(const OpInfo& op) { op_ = op; }

void ShmGroup::expect(uint8_t step) {
  desc_.seq = op_.seq;
  desc_.sig = op_.sig;
  desc_.code = op_.code;
  desc_.step = step;
  desc_fp_ = fingerprint(desc_);
  desc_pending_ = true;
  check_pending_ = true;
}

void ShmGroup::wake() {
  atomic(header().epoch).fetch_add(1, std::memory_order_seq_cst);
  if (atomic(header().sleepers).load(std::memory_order_seq_cst) > 0) futex_wake_shared(&header().epoch);
}

void ShmGroup::arrive() {
  ++phase_;
  Control& mine = control(local_rank_);
  if (desc_pending_) {
    mine.desc[phase_ & 1] = desc_;
    mine.fp[phase_ & 1] = desc_fp_;
    desc_pending_ = false;
  }
  // Where this rank ran, for waiters that choose between spinning and yielding.
  if (oversubscribed_) atomic(mine.cpu).store(static_cast<uint32_t>(sched_getcpu()), std::memory_order_relaxed);
  // Only a sleeper needs the epoch to change. A waiter announces itself in `sleepers`
  // before it checks the arrivals one last time and sleeps; with both sides
  // sequentially consistent, either it sees this arrival or this sees it. Skipping the
  // shared epoch when nobody sleeps keeps that cache line from bouncing between the
  // ranks on every phase (a seventh of a small allreduce's time here).
  atomic(mine.arrived).store(phase_, std::memory_order_seq_cst);
  notify();
}

void ShmGroup::notify() {
  if (atomic(header().sleepers).load(std::memory_order_seq_cst) > 0) wake();
}

bool ShmGroup::all_arrived(uint64_t phase) const {
  for (int i = 0; i < local_size_; ++i) {
    // Sequentially consistent: the last check before a sleep pairs with arrive()'s
    // store and load of `sleepers` (on x86 this costs nothing over acquire).
    if (atomic(control(i).arrived).load(std::memory_order_seq_cst) < phase) return false;
  }
  return true;
}

void ShmGroup::wait_all() {
  const uint64_t phase = phase_;
  wait_until([&] { return all_arrived(phase); },
             [&](bool liveness) { check_peers(phase, liveness); },
             [&] { fail_timeout(phase); },
             [&](uint32_t cpu) {  // whether a rank not yet arrived was last seen on `cpu`
               for (int i = 0; i < local_size_; ++i) {
                 Control& c = control(i);
                 if (atomic(c.arrived).load(std::memory_order_acquire) < phase &&
                     atomic(c.cpu).load(std::memory_order_relaxed) == cpu) return true;
               }
               return false;
             });
  if (check_pending_) {
    check_pending_ = false;
    check_descriptors();
  }
}

bool ShmGroup::poll_all(int polls) {
  const uint64_t phase = phase_;
  for (int i = 0; !all_arrived(phase); ++i) {
    if (i >= polls) return false;
    cpu_relax();
  }
  if (check_pending_) {
    check_pending_ = false;
    check_descriptors();
  }
  return true;
}

void ShmGroup::arrive_small(const void* data, size_t bytes) {
  std::memcpy(control(local_rank_).small[(phase_ + 1) & 1], data, bytes);
  arrive();
}

const uint8_t* ShmGroup::small_data(int i) const { return control(i).small[phase_ & 1]; }

void ShmGroup::begin_work(uint64_t pieces) {
  work_end_ += pieces;
  shares_.resize(static_cast<size_t>(local_size_));
  for (int r = 0; r < local_size_; ++r) {
    Share& s = shares_[static_cast<size_t>(r)];
    s.begin = s.end;  // the tickets of rank r's counter follow on from its last round
    s.end = s.begin + block_count(pieces, local_size_, r);
    s.first_piece = block_begin(pieces, local_size_, r);
  }
}

int64_t ShmGroup::take_piece() {
  // This rank's own share first, then the next rank's, and so on round the node.
  for (int k = 0; k < local_size_; ++k) {
    const int r = (local_rank_ + k) % local_size_;
    const Share& s = shares_[static_cast<size_t>(r)];
    auto taken = atomic(control(r).taken);
    uint64_t t = taken.load(std::memory_order_relaxed);
    // Never past the share's end: rank r's next round's tickets follow on, and a rank
    // still in this round must not take one of them.
    while (t < s.end) {
      if (taken.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        atomic(control(local_rank_).working).store(t + 1, std::memory_order_relaxed);
        return static_cast<int64_t>(s.first_piece + (t - s.begin));
      }
    }
  }
  return -1;
}

void ShmGroup::finish_piece() {
  Control& mine = control(local_rank_);
  atomic(mine.working).store(0, std::memory_order_relaxed);
  // Sequentially consistent (and so a release): whoever counts the round's pieces done
  // (work_done()) sees this piece's results. Sleepers are woken by the rank that finds
  // the round done on entering wait_work(), not here: a wake-up per piece would have a
  // woken rank take the core from the rank doing the work, only to find the round
  // unfinished.
  auto done = atomic(mine.done);
  done.store(done.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
}

bool ShmGroup::work_done() const {
  uint64_t done = 0;
  for (int i = 0; i < local_size_; ++i) done += atomic(control(i).done).load(std::memory_order_seq_cst);
  return done >= work_end_;
}

void ShmGroup::wait_work() {
  // Every rank comes here once it finds no piece left to take, so the one that finished
  // the round's last piece finds the round done here, and wakes whoever sleeps on it.
  if (work_done()) {
    notify();
    return;
  }
  auto holds_piece = [&](int i) {
    return atomic(control(i).working).load(std::memory_order_acquire) != 0;
  };
  wait_until([&] { return work_done(); },
             [&](bool liveness) {
               check_interrupt();
               for (int i = 0; i < local_size_; ++i) {
                 if (i == local_rank_) continue;
                 try {
                   // Only a rank that holds a piece is waited for. One that finished its
                   // pieces may have left the operation and closed meanwhile: then the
                   // round is done, which the check below sees.
                   check_peer(i, liveness, holds_piece(i),
                              "closed the communicator while it held a piece of shared work",
                              "while it held a piece of shared work that this rank waited for");
                 } catch (const PeerError&) {
                   if (work_done()) return;
                   throw;
                 }
               }
             },
             [&] {
               std::vector<int> awaited;
               for (int i = 0; i < local_size_; ++i) {
                 if (holds_piece(i)) awaited.push_back(i);
               }
               // A rank that stopped between taking its piece and marking it held: any
               // peer may be the one.
               if (awaited.empty()) {
                 for (int i = 0; i < local_size_; ++i) {
                   if (i != local_rank_) awaited.push_back(i);
                 }
               }
               fail_timeout_for(awaited, "finish its piece of the shared reduction");
             },
             [&](uint32_t cpu) {  // whether a rank holding a piece was last seen on `cpu`
               for (int i = 0; i < local_size_; ++i) {
                 if (holds_piece(i) && atomic(control(i).cpu).load(std::memory_order_relaxed) == cpu) {
                   return true;
                 }
               }
               return false;
             });
}

bool ShmGroup::wait_streams(const std::function<bool()>& ready, const std::function<void(bool)>& check,
                            const std::function<void()>& expired,
                            std::chrono::steady_clock::time_point until) {
  // A peer publishes its core only when it arrives at a phase, which the streams do
  // not do: always yield.
  return wait_until(ready, check, expired, [](uint32_t) { return true; }, until);
}

}  // namespace chorus::transport::shm
