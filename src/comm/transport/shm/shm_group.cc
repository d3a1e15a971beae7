// ShmGroup's set-up (the segment, its layout, the liveness handles), its cross-memory
// attach (probe, published buffers, reads of a peer's memory) and the streams' layout.
#include "comm/transport/shm/shm_group.h"

#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "chorus/error.h"
#include "comm/common/logging.h"
#include "comm/transport/shm/layout.h"

namespace chorus::transport::shm {
namespace {

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : static_cast<int>(fd);
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

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
  const Layout layout = Layout::of(local_size_, config.buffer_bytes);
  config_.buffer_bytes = layout.buffer_bytes;
  data_ = segment_.data() + layout.data_offset;
  slots_ = segment_.data() + layout.slots_offset;
  slot_count_ = layout.slots;
  pooled_ = layout.pooled;
  slot_control_ = layout.slot_control;
  ring_bytes_ = layout.ring_bytes;
  slot_stride_ = layout.slot_stride();
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  oversubscribed_ = static_cast<unsigned>(local_size_) > cores;
  no_spare_core_ = static_cast<unsigned>(local_size_) >= cores;
  crowded_ = static_cast<unsigned>(local_size_) > 2 * cores;
  pidfds_.assign(local_size_, -1);
}

ShmGroup::~ShmGroup() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

namespace {

// The local ranks' common verdict, in a constant number of store requests per rank (a
// node of L ranks used to make L^2): each rank that objects writes why under `base`
// + "no/<local rank>"; every rank counts itself in; the last to arrive publishes the
// objection of the lowest local rank, or "" when none objected (it alone reads the
// objections, and only when there are some); every rank reads what it published.
// Returns only once every local rank has counted itself in.
std::string agree(Store& store, const std::string& base, int local_rank, int local_size,
                  const std::string& objection) {
  if (!objection.empty()) {
    store.set(base + "no/" + std::to_string(local_rank), objection);
    store.add(base + "objections", 1);
  }
  if (store.add(base + "arrived", 1) == local_size) {
    std::string verdict = "ok";
    if (store.add(base + "objections", 0) > 0) {
      for (int i = 0; i < local_size; ++i) {
        if (store.check({base + "no/" + std::to_string(i)})) {
          verdict = "!" + store.get_string(base + "no/" + std::to_string(i));
          break;
        }
      }
    }
    store.set(base + "verdict", verdict);
  }
  const std::string verdict = store.get_string(base + "verdict");
  return verdict == "ok" ? "" : verdict.substr(1);
}

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::connect(Store& store, const GroupConfig& config,
                                            std::string& why_not) {
  const int local_size = static_cast<int>(config.members.size());
  const int local_rank = static_cast<int>(
      std::find(config.members.begin(), config.members.end(), config.rank) - config.members.begin());
  const std::string base = "shm/node" + std::to_string(config.node) + "/";
  const Layout layout = Layout::of(local_size, config.buffer_bytes);
  auto text = [](const Bytes& b) { return std::string(b.begin(), b.end()); };
  auto bytes_of = [](const std::string& s) { return Bytes(s.begin(), s.end()); };

  Segment segment;
  std::string error;
  if (local_rank == 0) {
    int stale = remove_stale_segments();
    if (stale > 0) CHORUS_LOG(kInfo, "removed " + std::to_string(stale) + " stale chorus segment(s) from /dev/shm");
    try {
      segment = Segment::create(layout.bytes);
      Header& h = *reinterpret_cast<Header*>(segment.data());
      h.magic = kMagic;
      h.version = kVersion;
      h.local_size = static_cast<uint32_t>(local_size);
      h.buffer_bytes = layout.buffer_bytes;
      h.ring_bytes = layout.ring_bytes;
      h.slots = static_cast<uint32_t>(layout.slots);
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
        segment = Segment::open(name, layout.bytes);
        const Header& h = *reinterpret_cast<const Header*>(segment.data());
        if (h.magic != kMagic || h.version != kVersion ||
            h.local_size != static_cast<uint32_t>(local_size) || h.buffer_bytes != layout.buffer_bytes ||
            h.ring_bytes != layout.ring_bytes || h.slots != static_cast<uint32_t>(layout.slots)) {
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
  {
    std::string verdict = agree(store, base + "ok/", local_rank, local_size,
                                error.empty() ? "" : "rank " + std::to_string(config.rank) + ": " + error);
    if (error.empty()) error = verdict;
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
  cma_ = agree(store, base + "cma/", local_rank_, local_size_,
               ok ? "" : "rank " + std::to_string(config_.rank) + " cannot read its peers").empty();
  CHORUS_LOG(kDebug, std::string("shared memory: cross-memory attach ") + (cma_ ? "on" : "off"));
}

void ShmGroup::publish_buffers(const void* in, void* out) {
  Control& mine = control(local_rank_);
  mine.in_addr = reinterpret_cast<uint64_t>(in);
  mine.out_addr = reinterpret_cast<uint64_t>(out);
}

uint64_t ShmGroup::peer_in(int i) const { return control(i).in_addr; }

void ShmGroup::publish_shared(const shared::SharedRef& send, const shared::SharedRef& recv) {
  peer_files_.sweep();  // the files of buffers freed since the last direct collective
  Control& mine = control(local_rank_);
  mine.shared[0] = send;
  mine.shared[1] = recv;
}

uint8_t* ShmGroup::peer_shared(int i, int which) {
  const shared::SharedRef ref = control(i).shared[which];
  std::string error;
  uint8_t* base = ref ? peer_files_.map(ref, error) : nullptr;
  if (base == nullptr) {
    if (!ref) error = "it published no buffer";
    throw PeerError(op_name() + " failed on " + rank_name(local_rank_) + ": cannot map the node-shared " +
                    (which == 0 ? "send" : "recv") + " buffer of " + rank_name(i) + ": " + error);
  }
  return base + ref.offset;
}
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

int ShmGroup::local_of(int rank) const {
  auto it = std::find(config_.members.begin(), config_.members.end(), rank);
  return it == config_.members.end() ? -1 : static_cast<int>(it - config_.members.begin());
}

ShmGroup::Stream ShmGroup::stream(int from, int to) const {
  return slot(from, to < from ? to : to - 1);
}

ShmGroup::Stream ShmGroup::slot(int from, int k) const {
  const size_t index = static_cast<size_t>(from) * static_cast<size_t>(slot_count_) + static_cast<size_t>(k);
  auto* ch = reinterpret_cast<Channel*>(slots_ + index * slot_stride_);
  return Stream{&ch->head, &ch->tail, reinterpret_cast<uint8_t*>(ch) + slot_control_, ring_bytes_,
                &ch->binding};
}

}  // namespace chorus::transport::shm
