#include "comm/transport/shm/shm_group.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "chorus/error.h"
#include "comm/common/logging.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus::transport::shm {
namespace {

constexpr uint64_t kMagic = 0x6d68732d73756f68ULL;  // "hous-shm"
constexpr uint32_t kVersion = 5;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kControlBytes = 1024;
constexpr size_t kReasonBytes = 768;

enum State : uint32_t { kActive = 0, kClosed = 1, kAborted = 2 };

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t data_offset(int local_size) {
  return round_up(kHeaderBytes + static_cast<size_t>(local_size) * kControlBytes, 4096);
}

// Point to point: each ordered pair's ring. The segment reserves its pages, so the rings
// shrink as pairs multiply: 256 KiB up to 6 ranks, 128 KiB for 7 and 8 (7 MiB in all),
// 64 KiB from 9 on (15 MiB for 16 ranks).
size_t channel_bytes_for(int local_size) {
  const size_t pairs = static_cast<size_t>(local_size) * static_cast<size_t>(std::max(local_size - 1, 1));
  size_t bytes = size_t{256} << 10;
  while (bytes > (size_t{64} << 10) && bytes * pairs > (size_t{8} << 20)) bytes /= 2;
  return bytes;
}
// A channel: its head and tail on a page of their own, then the ring.
size_t channel_stride(int local_size) { return 4096 + channel_bytes_for(local_size); }

size_t channels_offset(int local_size, size_t buffer_bytes) {
  return data_offset(local_size) + static_cast<size_t>(local_size) * 2 * buffer_bytes;
}

size_t segment_bytes(int local_size, size_t buffer_bytes) {
  const size_t pairs = static_cast<size_t>(local_size) * static_cast<size_t>(local_size - 1);
  return channels_offset(local_size, buffer_bytes) + pairs * channel_stride(local_size);
}

// Before every point-to-point message in its channel.
struct MessageHeader {
  uint32_t magic;
  uint8_t dtype;    // the send's (Signature)
  uint8_t reserved[3];
  uint64_t length;  // bytes that follow
  uint64_t number;  // 1, 2, ... per channel
  uint64_t count;   // the send's (Signature)
};
constexpr uint32_t kMessageMagic = 0x70327073;  // "sp2p"
// A stream moves at most this much before it publishes its progress, so that the
// receiver copies out while the sender copies in. 2 ranks, a message each way: 4 KiB
// pieces were slowest at every size (2 MiB 494-517 us, 16 MiB 4.3-4.7 ms), 16 and 32 KiB
// about equal (2 MiB 395-461 us, 16 MiB 3.4-3.8 ms), 64 KiB slower below 2 MiB.
constexpr size_t kStreamPiece = 16 * 1024;

void futex_wait_shared(uint32_t* word, uint32_t old, std::chrono::milliseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000) * 1000000L;
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, word, FUTEX_WAIT, old, &ts, nullptr, 0);
}

void futex_wake_shared(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : static_cast<int>(fd);
#else
  (void)pid;
  return -1;
#endif
}

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

}  // namespace

struct ShmGroup::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t local_size;
  uint64_t buffer_bytes;
  uint64_t channel_bytes;
  alignas(64) uint32_t epoch;     // futex word: changes with every arrival and abort
  alignas(64) uint32_t sleepers;  // ranks asleep on `epoch`
  alignas(64) uint64_t taken;     // shared work: pieces taken, in all rounds so far
  alignas(64) uint64_t finished;  // shared work: pieces finished, in all rounds so far
};

struct ShmGroup::Control {
  alignas(64) uint64_t arrived;  // last phase this rank reached
  uint32_t cpu;                  // the CPU it ran on when it last arrived
  uint64_t working;              // shared work: 1 + the ticket of the piece it holds; 0: none
  alignas(64) uint32_t state;    // State
  int32_t pid;
  OpDesc desc[2];                // by phase parity: a fast peer may publish the next one
  uint64_t in_addr, out_addr;    // publish_buffers(): the current operation's buffers
  uint64_t probe_addr, probe_value;  // set-up: where this rank's probe cookie is, and its value
  char reason[kReasonBytes];     // why it aborted, NUL-terminated
};

struct ShmGroup::Channel {
  alignas(64) uint64_t head;  // bytes the sender has written, in all
  alignas(64) uint64_t tail;  // bytes the receiver has read, in all
};



ShmGroup::Header& ShmGroup::header() const { return *reinterpret_cast<Header*>(segment_.data()); }

ShmGroup::Control& ShmGroup::control(int i) const {
  return *reinterpret_cast<Control*>(segment_.data() + kHeaderBytes +
                                     static_cast<size_t>(i) * kControlBytes);
}

uint8_t* ShmGroup::buffer(int i, int which) const {
  return data_ + (static_cast<size_t>(i) * 2 + static_cast<size_t>(which)) * config_.buffer_bytes;
}

ShmGroup::ShmGroup(const GroupConfig& config, Segment segment, int local_rank)
    : config_(config),
      segment_(std::move(segment)),
      local_rank_(local_rank),
      local_size_(static_cast<int>(config.members.size())) {
  static_assert(sizeof(Control) <= kControlBytes && sizeof(Header) <= kHeaderBytes);
  data_ = segment_.data() + data_offset(local_size_);
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  oversubscribed_ = static_cast<unsigned>(local_size_) > cores;
  crowded_ = static_cast<unsigned>(local_size_) > 2 * cores;
  pidfds_.assign(local_size_, -1);
  channel_bytes_ = channel_bytes_for(local_size_);
  sent_.assign(local_size_, 0);
  received_.assign(local_size_, 0);
}

ShmGroup::~ShmGroup() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::unique_ptr<ShmGroup> ShmGroup::connect(Store& store, const GroupConfig& config,
                                            std::string& why_not) {
  const int local_size = static_cast<int>(config.members.size());
  const int local_rank = static_cast<int>(
      std::find(config.members.begin(), config.members.end(), config.rank) - config.members.begin());
  const std::string base = "shm/node" + std::to_string(config.node) + "/";
  const size_t bytes = segment_bytes(local_size, config.buffer_bytes);
  auto text = [](const Bytes& b) { return std::string(b.begin(), b.end()); };
  auto bytes_of = [](const std::string& s) { return Bytes(s.begin(), s.end()); };

  Segment segment;
  std::string error;
  if (local_rank == 0) {
    int stale = remove_stale_segments();
    if (stale > 0) CHORUS_LOG(kInfo, "removed " + std::to_string(stale) + " stale chorus segment(s) from /dev/shm");
    try {
      segment = Segment::create(bytes);
      Header& h = *reinterpret_cast<Header*>(segment.data());
      h.magic = kMagic;
      h.version = kVersion;
      h.local_size = static_cast<uint32_t>(local_size);
      h.buffer_bytes = config.buffer_bytes;
      h.channel_bytes = channel_bytes_for(local_size);
      store.set(base + "name", bytes_of(segment.name()));
    } catch (const Error& e) {
      error = e.what();
      store.set(base + "name", bytes_of("!" + error));
    }
  } else {
    std::string name = text(store.get(base + "name"));
    if (!name.empty() && name[0] == '!') {
      error = "local rank 0 (rank " + std::to_string(config.members[0]) + ") could not create it: " + name.substr(1);
    } else {
      try {
        segment = Segment::open(name, bytes);
        const Header& h = *reinterpret_cast<const Header*>(segment.data());
        if (h.magic != kMagic || h.version != kVersion ||
            h.local_size != static_cast<uint32_t>(local_size) || h.buffer_bytes != config.buffer_bytes ||
            h.channel_bytes != channel_bytes_for(local_size)) {
          throw SystemError("shared memory: '/dev/shm/" + name + "' has a different layout");
        }
      } catch (const Error& e) {
        error = e.what();
      }
    }
  }
  std::unique_ptr<ShmGroup> group;
  if (error.empty()) {
    group.reset(new ShmGroup(config, std::move(segment), local_rank));
    Control& mine = group->control(local_rank);
    mine.pid = static_cast<int32_t>(getpid());
    group->probe_cookie_ = std::random_device()() | (static_cast<uint64_t>(std::random_device()()) << 32);
    mine.probe_addr = reinterpret_cast<uint64_t>(&group->probe_cookie_);
    mine.probe_value = group->probe_cookie_;
    atomic(mine.state).store(kActive);
  }
  store.set(base + "ok/" + std::to_string(local_rank), bytes_of(error.empty() ? "ok" : error));
  for (int i = 0; i < local_size; ++i) {
    if (i == local_rank) continue;
    std::string answer = text(store.get(base + "ok/" + std::to_string(i)));
    if (answer != "ok" && error.empty()) {
      error = "rank " + std::to_string(config.members[i]) + ": " + answer;
    }
  }
  // Every local rank has mapped the segment (or given up): the name is not needed any
  // more, and without it nothing is left behind whatever happens to the job.
  if (group && local_rank == 0) group->segment_.unlink();
  if (!error.empty()) {
    why_not = error;
    return nullptr;
  }
  pid_t self = getpid();
  for (int i = 0; i < local_size; ++i) {
    pid_t pid = group->control(i).pid;
    if (pid != self) group->pidfds_[i] = open_pidfd(pid);
  }
  group->next_liveness_check_ = std::chrono::steady_clock::now();
  group->probe_cma(store, base);
  return group;
}

// Every rank reads every peer's probe cookie through process_vm_readv and reports
// whether all came back right; cross-memory attach is used only when all did, so that
// every rank picks the same algorithms.
void ShmGroup::probe_cma(Store& store, const std::string& base) {
  bool ok = config_.try_cma && (config_.cma_any_size || local_size_ == 2);
  for (int i = 0; i < local_size_ && ok; ++i) {
    if (i == local_rank_) continue;
    const Control& c = control(i);
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(c.probe_addr), sizeof value};
    ok = process_vm_readv(c.pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof value) &&
         value == c.probe_value;
  }
  const std::string key = base + "cma/";
  store.set(key + std::to_string(local_rank_), Bytes{static_cast<uint8_t>(ok ? 1 : 0)});
  bool all = ok;
  for (int i = 0; i < local_size_; ++i) {
    if (i == local_rank_) continue;
    Bytes b = store.get(key + std::to_string(i));
    all = all && b.size() == 1 && b[0] == 1;
  }
  cma_ = all;
  CHORUS_LOG(kDebug, std::string("shared memory: cross-memory attach ") + (cma_ ? "on" : "off"));
}

void ShmGroup::publish_buffers(const void* in, void* out) {
  Control& mine = control(local_rank_);
  mine.in_addr = reinterpret_cast<uint64_t>(in);
  mine.out_addr = reinterpret_cast<uint64_t>(out);
}

uint64_t ShmGroup::peer_in(int i) const { return control(i).in_addr; }
uint64_t ShmGroup::peer_out(int i) const { return control(i).out_addr; }

void ShmGroup::read_peer(int i, uint64_t from, void* to, size_t bytes) {
  const pid_t pid = control(i).pid;
  auto* dst = static_cast<uint8_t*>(to);
  while (bytes > 0) {
    // The kernel copies at most this much per call; bounded calls also keep an
    // interrupt or a deadline from waiting behind one very long copy.
    const size_t n = std::min<size_t>(bytes, size_t{64} << 20);
    iovec local{dst, n};
    iovec remote{reinterpret_cast<void*>(from), n};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      fail_read(i, got < 0 ? errno : EFAULT);
    }
    dst += got;
    from += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
    if (interrupted_.load(std::memory_order_acquire) || op_.deadline.expired()) {
      check_peers(phase_ + 1, true);
      if (op_.deadline.expired()) fail_timeout(phase_ + 1);
    }
  }
}

void ShmGroup::fail_read(int i, int err) {
  // A peer that was killed is usually why: give its exit up to a second to show, so
  // that the error says it died, as everywhere else.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  do {
    check_peers(phase_ + 1, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < until);
  std::string who = rank_name(i);
  who.insert(who.size() - 1, ", pid " + std::to_string(control(i).pid));
  throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": reading the buffers of " +
                  who + " failed: " + std::strerror(err));
}

void ShmGroup::begin(const OpInfo& op) { op_ = op; }

void ShmGroup::expect(uint8_t step) {
  desc_.seq = op_.seq;
  desc_.sig = op_.sig;
  desc_.code = op_.code;
  desc_.step = step;
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

template <class Ready, class Check, class Expired, class OnMyCore>
void ShmGroup::wait_until(Ready&& ready, Check&& check, Expired&& expired, OnMyCore&& on_my_core) {
  if (oversubscribed_) {
    // The rank we wait for may need this very core: hand it over at once (a yield
    // costs far less than a futex sleep and wake-up), a bounded number of times. When
    // the ranks we wait for were last seen on other cores, they are running there and
    // a yield would only hand this core to a local rank that waits too, and have it
    // hand the core back (some 7 us a switch on this machine): spin a few microseconds
    // first, then yield all the same, in case one of them has moved here since.
    // 4 ranks on 2 cores, allreduce 64 B-4 KiB: 12.5-14.0 -> 8.8-10.7 us.
    for (int i = 0; i < kOversubscribedYields; ++i) {
      if (ready()) return;
      if (!on_my_core(static_cast<uint32_t>(sched_getcpu()))) {
        for (int k = 0; k < kOversubscribedSpins && !ready(); ++k) cpu_relax();
        if (ready()) return;
      }
      sched_yield();
    }
  } else {
    for (int i = 0; i < kSpins; ++i) {
      if (ready()) return;
      if (i >= 64 && (i & 63) == 0) sched_yield();
      cpu_relax();
    }
  }
  while (!ready()) {
    auto now = std::chrono::steady_clock::now();
    bool liveness = now >= next_liveness_check_;
    if (liveness) next_liveness_check_ = now + kLivenessPeriod;
    check(liveness);
    if (ready()) return;  // a check may let what arrived meanwhile through
    if (op_.deadline.expired()) expired();
    Header& h = header();
    atomic(h.sleepers).fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = atomic(h.epoch).load(std::memory_order_seq_cst);
    if (!ready()) {
      auto nap = std::min<std::chrono::milliseconds>(kLivenessPeriod, op_.deadline.remaining());
      futex_wait_shared(&h.epoch, seen, std::max(nap, std::chrono::milliseconds(1)));
    }
    atomic(h.sleepers).fetch_sub(1, std::memory_order_seq_cst);
  }
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

void ShmGroup::begin_work(uint64_t pieces) {
  work_begin_ = work_end_;
  work_end_ = work_begin_ + pieces;
}

int64_t ShmGroup::take_piece() {
  auto taken = atomic(header().taken);
  uint64_t t = taken.load(std::memory_order_relaxed);
  // Never past the round's end: the next round's tickets follow on, and a rank still
  // in this round must not take one of them.
  while (t < work_end_) {
    if (taken.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      atomic(control(local_rank_).working).store(t + 1, std::memory_order_relaxed);
      return static_cast<int64_t>(t - work_begin_);
    }
  }
  return -1;
}

void ShmGroup::finish_piece() {
  atomic(control(local_rank_).working).store(0, std::memory_order_relaxed);
  // Release: whoever sees the count reach the round's end sees every piece's results
  // (each increment continues the release sequence of the ones before it).
  // Only the round's last piece wakes sleepers: the waiters wait for the round to end,
  // and a wake-up per piece would have a woken rank take the core from the rank doing
  // the work, only to find the round unfinished.
  if (atomic(header().finished).fetch_add(1, std::memory_order_seq_cst) + 1 == work_end_) notify();
}

bool ShmGroup::work_done() const {
  return atomic(header().finished).load(std::memory_order_seq_cst) >= work_end_;
}

void ShmGroup::wait_work() {
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

void ShmGroup::check_interrupt() {
  if (interrupted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    throw AbortedError(op_name() + " on " + rank_name(local_rank_) + " was aborted: " + interrupt_reason_);
  }
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
    const OpDesc& theirs = control(i).desc[parity];
    if (theirs == desc_) continue;
    auto call = [](const OpDesc& d) { return describe_call(d.code, nullptr, d.seq, false, d.sig); };
    std::string m = op_name() + " failed on " + rank_name(local_rank_) + ": ";
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

int ShmGroup::local_of(int rank) const {
  auto it = std::find(config_.members.begin(), config_.members.end(), rank);
  return it == config_.members.end() ? -1 : static_cast<int>(it - config_.members.begin());
}

ShmGroup::Channel& ShmGroup::channel(int from, int to) const {
  const size_t index = static_cast<size_t>(from) * static_cast<size_t>(local_size_ - 1) +
                       static_cast<size_t>(to < from ? to : to - 1);
  return *reinterpret_cast<Channel*>(segment_.data() + channels_offset(local_size_, config_.buffer_bytes) +
                                     index * channel_stride(local_size_));
}

uint8_t* ShmGroup::ring(int from, int to) const {
  return reinterpret_cast<uint8_t*>(&channel(from, to)) + 4096;
}

void ShmGroup::send(int i, const void* data, size_t len) {
  const MessageHeader h{kMessageMagic, op_.sig.dtype, {}, len, ++sent_[i], op_.sig.count};
  write_stream(i, reinterpret_cast<const uint8_t*>(&h), sizeof h);
  write_stream(i, static_cast<const uint8_t*>(data), len);
}

void ShmGroup::recv(int i, void* data, size_t len) {
  MessageHeader h;
  read_stream(i, reinterpret_cast<uint8_t*>(&h), sizeof h);
  const uint64_t number = ++received_[i];
  if (h.magic != kMessageMagic || h.number != number) {
    throw PeerError(op_name() + " on " + rank_name(local_rank_) + ": corrupt message from " +
                    rank_name(i) + " in shared memory (expected message " + std::to_string(number) +
                    ", found magic " + std::to_string(h.magic) + " and number " +
                    std::to_string(h.number) + ")");
  }
  const Signature sent{h.count, -1, h.dtype, kNoReduce};
  if (sent != op_.sig) {
    throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": " +
                    mismatch_text(rank_name(i), config_.members[i], describe_call(op_.code, "send", 0, true, sent),
                                  describe_call(op_.code, op_.name, 0, true, op_.sig)));
  }
  if (h.length != len) {
    throw PeerError("mismatched message from " + rank_name(i) + " to " + rank_name(local_rank_) +
                    " in " + op_name() + ": it sent " + std::to_string(h.length) +
                    " bytes where this rank's recv expects " + std::to_string(len) +
                    ": the ranks issued different operations, counts or types");
  }
  read_stream(i, static_cast<uint8_t*>(data), len);
}

void ShmGroup::write_stream(int to, const uint8_t* data, size_t n) {
  Channel& ch = channel(local_rank_, to);
  uint8_t* r = ring(local_rank_, to);
  const size_t cap = channel_bytes_;
  uint64_t head = atomic(ch.head).load(std::memory_order_relaxed);  // only this rank writes it
  while (n > 0) {
    const uint64_t tail = atomic(ch.tail).load(std::memory_order_acquire);
    if (head - tail == cap) {
      wait_for_peer(to, [&] { return atomic(ch.tail).load(std::memory_order_acquire) != tail; },
                    "receive");
      continue;
    }
    const size_t at = head % cap;
    const size_t k = std::min({n, static_cast<size_t>(cap - (head - tail)), cap - at, kStreamPiece});
    std::memcpy(r + at, data, k);
    data += k;
    n -= k;
    head += k;
    // Sequentially consistent, as an arrival: pairs with a sleeper's last check.
    atomic(ch.head).store(head, std::memory_order_seq_cst);
    notify();
  }
}

void ShmGroup::read_stream(int from, uint8_t* data, size_t n) {
  Channel& ch = channel(from, local_rank_);
  const uint8_t* r = ring(from, local_rank_);
  const size_t cap = channel_bytes_;
  uint64_t tail = atomic(ch.tail).load(std::memory_order_relaxed);  // only this rank writes it
  while (n > 0) {
    const uint64_t head = atomic(ch.head).load(std::memory_order_acquire);
    if (head == tail) {
      wait_for_peer(from, [&] { return atomic(ch.head).load(std::memory_order_acquire) != tail; },
                    "send");
      continue;
    }
    const size_t at = tail % cap;
    const size_t k = std::min({n, static_cast<size_t>(head - tail), cap - at, kStreamPiece});
    std::memcpy(data, r + at, k);
    data += k;
    n -= k;
    tail += k;
    atomic(ch.tail).store(tail, std::memory_order_seq_cst);
    notify();
  }
}

template <class Ready>
void ShmGroup::wait_for_peer(int i, Ready&& ready, const char* what) {
  wait_until(ready,
             [&](bool liveness) {
               check_interrupt();
               try {
                 check_peer(i, liveness, true,
                            std::string("closed the communicator while this rank waited for it to ") + what,
                            std::string("while this rank waited for it to ") + what + " in shared memory");
               } catch (const PeerError&) {
                 if (!ready()) throw;  // what it wrote before it left is still for this rank to take
               }
             },
             [&] {
               throw TimeoutError(op_name() + " timed out on " + rank_name(local_rank_) +
                                      " waiting in shared memory for " + rank_name(i) + " to " + what +
                                      " (a peer is stopped, hung, or behind in a different operation)",
                                  {config_.members[i]});
             },
             // A peer publishes its core only when it arrives at a phase, which
             // point-to-point traffic does not do: always yield.
             [](uint32_t) { return true; });
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

}  // namespace chorus::transport::shm
