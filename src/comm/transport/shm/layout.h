// The layout of a node's segment and the waiting primitives over it, shared by the
// files of ShmGroup (shm_group.cc: set-up and cross-memory attach; phases.cc: phases and
// shared work; peers.cc: liveness, aborts and the errors that name a peer) and by
// ShmTransport (shm_transport.cc: point-to-point streams). Internal to
// src/comm/transport/shm/: nothing outside this folder includes it.
//
// Segment (Layout below): a header page; one control block per local rank; two
// buffers per local rank; then each local rank's stream slots, the rings it sends
// through. Every part grows with the local ranks, none with their pairs: with up to
// kStreamSlots + 1 local ranks each rank has a slot per peer, bound to it for good;
// beyond, kStreamSlots slots that it binds to the peers it sends to as it needs them
// (shm_transport.h).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "comm/transport/shm/shm_group.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus::transport::shm {

inline constexpr uint64_t kMagic = 0x6d68732d73756f68ULL;  // "hous-shm"
inline constexpr uint32_t kVersion = 10;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kControlBytes = 1152;
inline constexpr size_t kReasonBytes = 640;

enum State : uint32_t { kActive = 0, kClosed = 1, kAborted = 2 };

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The stream slots of a local rank beyond kStreamSlots + 1 local ranks, and their rings.
// A sender with more peers than slots binds a slot to a peer when it first sends to it
// and binds it to another once that peer has read all of it. 8 x 32 KiB: 256 ranks'
// slots take 64 MiB, where a ring per ordered pair (64 KiB each) took 4.3 GB.
inline constexpr int kStreamSlots = 8;
inline constexpr size_t kPooledRingBytes = size_t{32} << 10;
// The most that the buffers of all local ranks may take together: a rank's two buffers
// shrink (powers of two, not below kMinBufferBytes) once the node has more than 32 ranks
// of the default 1 MiB. 256 ranks: 128 KiB each, 64 MiB in all, where 512 MiB.
inline constexpr size_t kBuffersBudget = size_t{64} << 20;
inline constexpr size_t kMinBufferBytes = size_t{64} << 10;

// Where everything lies in a segment of `local_size` ranks; of(). The same on every
// rank: set-up compares the header's copy of it.
struct Layout {
  int local_size = 0;
  size_t buffer_bytes = 0;   // each of a rank's two buffers
  int slots = 0;             // stream slots per local rank
  bool pooled = false;       // slots bound on demand (fewer slots than peers)
  size_t ring_bytes = 0;     // each slot's ring
  size_t slot_control = 0;   // a slot's head and tail before its ring
  size_t data_offset = 0;    // the buffers
  size_t slots_offset = 0;   // the stream slots, a rank's together
  size_t bytes = 0;          // the segment

  size_t slot_stride() const { return slot_control + ring_bytes; }
  // A rank's buffers for `requested` bytes each (GroupConfig::buffer_bytes): within
  // kBuffersBudget for all, never more than requested.
  static size_t buffer_bytes_for(int local_size, size_t requested) {
    const size_t ranks = static_cast<size_t>(std::max(local_size, 1));
    size_t bytes = requested;
    while (bytes > kMinBufferBytes && bytes * 2 * ranks > kBuffersBudget) bytes /= 2;
    return bytes;
  }
  static Layout of(int local_size, size_t requested_buffer_bytes) {
    Layout l;
    l.local_size = local_size;
    l.buffer_bytes = buffer_bytes_for(local_size, requested_buffer_bytes);
    const int peers = std::max(local_size - 1, 1);
    l.pooled = peers > kStreamSlots;
    l.slots = l.pooled ? kStreamSlots : peers;
    if (l.pooled) {
      // Two cache lines (head with the binding, tail), the ring right after.
      l.ring_bytes = kPooledRingBytes;
      l.slot_control = 128;
    } else {
      // A ring per peer, shrinking as pairs multiply: 256 KiB up to 6 ranks, 128 KiB
      // for 7 and 8 (7 MiB for 8), 64 KiB for 9. Head and tail on a page of their own.
      const size_t pairs = static_cast<size_t>(local_size) * static_cast<size_t>(peers);
      l.ring_bytes = size_t{256} << 10;
      while (l.ring_bytes > (size_t{64} << 10) && l.ring_bytes * pairs > (size_t{8} << 20)) l.ring_bytes /= 2;
      l.slot_control = 4096;
    }
    l.data_offset = round_up(kHeaderBytes + static_cast<size_t>(local_size) * kControlBytes, 4096);
    l.slots_offset = l.data_offset + static_cast<size_t>(local_size) * 2 * l.buffer_bytes;
    l.bytes = l.slots_offset + static_cast<size_t>(local_size) * static_cast<size_t>(l.slots) * l.slot_stride();
    return l;
  }
};

inline void futex_wait_shared(uint32_t* word, uint32_t old, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000L;
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, word, FUTEX_WAIT, old, &ts, nullptr, 0);
}

inline void futex_wake_shared(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Tells the CPU this is a spin-wait loop (frees the core's pipeline for its sibling).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

template <typename T>
std::atomic_ref<T> atomic(T& v) {
  return std::atomic_ref<T>(v);
}

struct ShmGroup::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t local_size;
  uint64_t buffer_bytes;
  uint64_t ring_bytes;
  uint32_t slots;
  alignas(64) uint32_t epoch;     // futex word: changes with every arrival and abort
  alignas(64) uint32_t sleepers;  // ranks asleep on `epoch`
};

struct ShmGroup::Control {
  // What a waiting peer reads at every phase, in one cache line so that one transfer of
  // it brings all: a small allreduce's exchange then moves one line each way, as a bare
  // exchange of a counter does, instead of three (arrival, descriptor, buffer).
  alignas(64) uint64_t arrived;  // last phase this rank reached
  uint64_t fp[2];                // by phase parity: fingerprint of desc[] (fingerprint())
  uint8_t small[2][NodeGroup::kSmallBytes];  // by phase parity: arrive_small()'s data
  alignas(64) uint32_t cpu;      // the CPU it ran on when it last arrived
  uint64_t working;              // shared work: 1 + the ticket of the piece it holds; 0: none
  uint64_t done;                 // shared work: pieces it finished, in all rounds so far
  // Shared work: tickets of this rank's share taken, in all rounds so far, by it or by
  // a rank that ran out of its own; on a line of its own, which only this rank writes
  // while nobody is out of work.
  alignas(64) uint64_t taken;
  alignas(64) uint32_t state;    // State
  int32_t pid;
  OpDesc desc[2];                // by phase parity: a fast peer may publish the next one
  uint64_t in_addr, out_addr;    // publish_buffers(): the current operation's buffers
  uint64_t probe_addr, probe_value;  // set-up: where this rank's probe cookie is, and its value
  shared::SharedRef shared[2];   // publish_shared(): the operation's send and recv
  // What this rank waits in, in the streams (publish_waiting()): written under a
  // sequence lock, `waiting_version` odd while it changes.
  alignas(64) uint64_t waiting_version;
  uint64_t waiting_for;          // local ranks awaited, a bit each (bit 63: 63 and beyond)
  uint64_t waiting_call[5];      // the OpDesc, as words (read while it may change)
  uint64_t waiting;              // 1 while published
  char reason[kReasonBytes];     // why it aborted, NUL-terminated
};

// A stream slot of a sender. Pooled (Layout::pooled), `binding` says to whom the slot
// goes: (number of the binding << 32) | (receiver's local rank + 1), 0 before the first;
// the sender changes it only while the slot is empty (tail == head), and a receiver
// that read head re-reads it, on the same line, so as not to take bytes of a later
// binding for its own. Without a pool, slot k goes to the k-th peer for good.
struct ShmGroup::Channel {
  alignas(64) uint64_t head;  // bytes the sender has written, in all
  uint64_t binding;           // pooled: whose the slot is, with the binding's number
  alignas(64) uint64_t tail;  // bytes the receiver(s) have read, in all
};

template <class Ready, class Check, class Expired, class OnMyCore>
bool ShmGroup::wait_until(Ready&& ready, Check&& check, Expired&& expired, OnMyCore&& on_my_core,
                          std::chrono::steady_clock::time_point until) {
  using Clock = std::chrono::steady_clock;
  const bool sliced = until != Clock::time_point::max();
  if (oversubscribed_) {
    // The rank we wait for may need this very core: hand it over at once (a yield
    // costs far less than a futex sleep and wake-up), a bounded number of times. When
    // the ranks we wait for were last seen on other cores, they are running there and
    // a yield would only hand this core to a local rank that waits too, and have it
    // hand the core back (some 7 us a switch on this machine): spin a few microseconds
    // first, then yield all the same, in case one of them has moved here since.
    // 4 ranks on 2 cores, allreduce 64 B-4 KiB: 12.5-14.0 -> 8.8-10.7 us.
    for (int i = 0; i < config_.oversubscribed_yields; ++i) {
      if (ready()) return true;
      if (!on_my_core(static_cast<uint32_t>(sched_getcpu()))) {
        for (int k = 0; k < config_.oversubscribed_spins && !ready(); ++k) cpu_relax();
        if (ready()) return true;
      }
      sched_yield();
      if (sliced && Clock::now() >= until) return false;
    }
  } else {
    for (int i = 0; i < config_.spins; ++i) {
      if (ready()) return true;
      if (i >= 64 && (i & 63) == 0) {
        sched_yield();
        if (sliced && Clock::now() >= until) return false;
      }
      cpu_relax();
    }
  }
  while (!ready()) {
    auto now = Clock::now();
    if (now >= until) return false;
    bool liveness = now >= next_liveness_check_;
    if (liveness) next_liveness_check_ = now + kLivenessPeriod;
    check(liveness);
    if (ready()) return true;  // a check may let what arrived meanwhile through
    if (op_.deadline.expired()) expired();
    Header& h = header();
    atomic(h.sleepers).fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = atomic(h.epoch).load(std::memory_order_seq_cst);
    if (!ready()) {
      std::chrono::microseconds nap = std::min<std::chrono::microseconds>(
          kLivenessPeriod, op_.deadline.remaining());
      if (sliced) {
        nap = std::min(nap, std::chrono::ceil<std::chrono::microseconds>(until - now));
      }
      futex_wait_shared(&h.epoch, seen, std::max(nap, std::chrono::microseconds(sliced ? 1 : 1000)));
    }
    atomic(h.sleepers).fetch_sub(1, std::memory_order_seq_cst);
  }
  return true;
}

}  // namespace chorus::transport::shm
