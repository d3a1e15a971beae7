#include "comm/core/communicator_impl.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <numeric>
#include <string_view>

#include "chorus/error.h"
#include "comm/common/event.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/algorithms/algorithms.h"
#include "comm/core/cost_model.h"
#include "comm/reduce/reduce.h"
#include "comm/store/key_ledger.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "comm/transport/topology.h"

namespace chorus {
namespace internal {
namespace {

// How long the progress thread naps instead of sleeping after its last operation, while
// callers run their operations themselves (kHelpedStreak in a row, see progress_loop()),
// and how long each nap is. 8-byte allreduce over shared memory, 2 ranks: 1.2 -> 1.0 us
// with 5 ms naps.
constexpr auto kProgressLinger = std::chrono::milliseconds(20);
constexpr auto kHelpedTick = std::chrono::microseconds(2000);
constexpr uint32_t kHelpedStreak = 16;
// How long the progress thread leaves a newly issued operation to a caller that may be
// about to wait for it (and run it itself, help()), yielding meanwhile: woken by the
// call, the thread often ran before the caller got there (see progress_loop()).
constexpr auto kClaimGrace = std::chrono::microseconds(50);

std::string choose_listen_address(const CommOptions& options, Store* store) {
  if (!options.listen_address.empty()) return options.listen_address;
  std::string host = store->server_host();
  if (!host.empty()) {
    std::string local = net::local_address_towards(host);
    if (!local.empty()) return local;
  }
  return "127.0.0.1";
}

}  // namespace

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size,
                                   CommOptions options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      user_store_(std::move(store)),
      recorder_(options_.trace_buffer_size) {
  // Creation writes through a ledger: what it wrote leaves the store at the end.
  auto ledger = std::make_shared<KeyLedger>(user_store_);
  PrefixStore scoped("chorus/comm/" + options_.comm_id, ledger);
  transport::tcp::TcpOptions tcp;
  tcp.listen_address = choose_listen_address(options_, user_store_.get());
  tcp.comm_id = options_.comm_id;
  tcp.token = options_.job_token;
  tcp.connect_timeout = options_.connect_timeout;
  transport_ = transport::tcp::connect_mesh(scoped, rank_, size_, tcp);
  for (int r = 0; r < size_; ++r) hosts_.push_back(transport_->host_of(r));
  topology_ = discover_topology(scoped, rank_, size_, local_node_id(options_.node_id));
  connect_shared_memory(scoped);
  shape_.size = size_;
  shape_.nodes = topology_.nodes;
  shape_.local_size = topology_.local_size;
  shape_.shm = shm_ != nullptr;
  shape_.hierarchical = hierarchical_possible();
  if (shm_) shape_.shm_chunk = shm_->buffer_bytes();
  shape_.segment_bytes = options_.segment_bytes;
  cost_ = parse_cost_params(settings::cost_model());
  finish_creation(*ledger);
  thread_ = std::thread([this] { progress_loop(); });
  // CHORUS_DEBUG=INFO (or CHORUS_LOG_LEVEL=info): how this communicator was set up.
  CHORUS_LOG(kInfo, "communicator set up on " << where() << ": "
                                     << size_ << " ranks on " << topology_.nodes << " node(s), "
                                     << topology_.local_size << " on this one, which talk over "
                                     << (shm_ ? "shared memory" : "tcp") << "; algorithm "
                                     << algorithm_name(options_.algorithm) << ", reduce kernels "
                                     << reduce_isa_name(reduce_isa()) << ", timeout "
                                     << options_.timeout.count() << " ms");
}

void CommunicatorImpl::finish_creation(KeyLedger& ledger) {
  // Once every rank is here, every rank has read all that the others published: a
  // barrier (over tcp, a few zero-byte frames), then each deletes the keys it wrote.
  if (size_ > 1) {
    transport::OpInfo info;
    info.name = "creation barrier";
    info.code = transport::op_code_of("barrier");
    info.seq = 0;
    info.deadline = Deadline(options_.connect_timeout);
    transport_->begin(info);
    algorithms::Context ctx{*transport_, rank_,    size_, DataType::kUInt8, 1, nullptr,
                            false,       scratch_, options_.segment_bytes,  topology_};
    algorithms::barrier_dissemination(ctx);
  }
  ledger.erase_written();
}

void CommunicatorImpl::connect_shared_memory(Store& scoped) {
  if (options_.transport == TransportKind::kTcp || topology_.local_size < 2) return;
  transport::shm::GroupConfig config;
  config.rank = rank_;
  config.members = topology_.node_ranks[topology_.node];
  config.hosts = hosts_;
  config.node = topology_.node;
  const int cma = settings::shm_cma();
  config.try_cma = cma > 0;
  config.cma_any_size = cma == 2;
  std::string why_not;
  shm_ = transport::shm::ShmGroup::connect(scoped, config, why_not);
  if (shm_) return;
  std::string message = "shared memory between the " + std::to_string(topology_.local_size) +
                        " ranks of this node could not be set up: " + why_not;
  if (options_.transport == TransportKind::kShm) {
    throw SystemError("creating communicator '" + options_.comm_id + "' on " + where() + ": " +
                      message + " (CHORUS_TRANSPORT=shm)");
  }
  CHORUS_LOG(kWarn, message + "; using tcp inside the node");
}

CommunicatorImpl::~CommunicatorImpl() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  // The contract (communicator.h): what is still pending is aborted, not waited for;
  // the peers may never issue it, and waiting lasted up to CHORUS_TIMEOUT.
  const size_t pending = unfinished_.load(std::memory_order_acquire);
  if (pending > 0) {
    std::string why = where() + " was destroyed with " + std::to_string(pending) +
                      (pending == 1 ? " operation" : " operations") +
                      " pending (wait for every Work before dropping the communicator)";
    CHORUS_LOG(kWarn, why);
    abort_with(why);
  }
  queue_signal_.fetch_add(1, std::memory_order_release);
  futex_wake_all(queue_signal_);
  if (thread_.joinable()) thread_.join();
  if (!transport_aborted_) {
    transport_->close();
    if (shm_) shm_->close();
  }
}

const std::string& CommunicatorImpl::host_of(int rank) const { return hosts_.at(rank); }

std::string CommunicatorImpl::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (host " +
         hosts_[rank_] + ", communicator '" + options_.comm_id + "')";
}

Work CommunicatorImpl::enqueue(const OpSpec& spec, OpBody body) {
  // CHORUS_DEBUG=DETAIL: two threads issuing at the same moment put their operations
  // in an order that may differ on every rank (the fingerprints cannot see it when
  // both calls look alike). Catches the calls that overlap here, which two threads
  // issuing in loops do within a few calls; one atomic add each.
  struct Issuing {
    std::atomic<int>* count = nullptr;
    ~Issuing() {
      if (count) count->fetch_sub(1, std::memory_order_acq_rel);
    }
  } issuing;
  if (options_.check_consistency) {
    issuing.count = &issuing_;
    if (issuing_.fetch_add(1, std::memory_order_acq_rel) != 0) {
      throw InvalidArgumentError(
          std::string(spec.name) + " on " + where() +
          ": issued while another thread was issuing an operation on this communicator "
          "(found by CHORUS_DEBUG=DETAIL); the ranks must issue operations in one order, so "
          "issue them from one thread or order the threads yourself");
    }
  }
  std::shared_ptr<WorkState> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t seq = spec.collective ? next_collective_++ : next_p2p_++;
    work = std::make_shared<WorkState>(spec.name, seq, weak_from_this());
    size_t slot = recorder_.enabled() ? recorder_.queued(seq, spec.collective, spec.name,
                                                          dtype_name(spec.dtype), spec.count, spec.root)
                                      : 0;
    queue_.push_back(Op{spec, seq, std::move(body), work, slot, std::chrono::steady_clock::now()});
    unfinished_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_progress_thread();
  return Work(work);
}

std::optional<CommunicatorImpl::Op> CommunicatorImpl::pop() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (queue_.empty()) return std::nullopt;
  std::optional<Op> op(std::move(queue_.front()));
  queue_.pop_front();
  return op;
}

void CommunicatorImpl::wake_progress_thread() {
  queue_signal_.fetch_add(1, std::memory_order_seq_cst);
  // The syscall only when the thread sleeps: see the matching order in progress_loop().
  if (progress_sleeping_.load(std::memory_order_seq_cst)) futex_wake_all(queue_signal_);
}

bool CommunicatorImpl::run_queued(const WorkState* until) {
  bool expected = false;
  if (!running_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
  while (until == nullptr || !until->completed()) {
    std::optional<Op> op = pop();
    if (!op) break;
    run(*op);
    // Only the runner writes it: no read-modify-write needed.
    const uint32_t streak = helped_streak_.load(std::memory_order_relaxed);
    helped_streak_.store(until != nullptr ? streak + 1 : 0, std::memory_order_relaxed);
  }
  if (abort_requested_.load() && !transport_aborted_) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    // Shared memory first: it tells the local peers at once, while tcp's abort lingers
    // up to half a second for its peers to hang up.
    if (shm_) shm_->abort(abort_reason_);
    transport_->abort(abort_reason_);
    transport_aborted_ = true;
  }
  running_.store(false, std::memory_order_release);
  bool left_behind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left_behind = !queue_.empty();
  }
  if (left_behind && until != nullptr) {
    // Operations queued behind the helped one must not wait for the next tick.
    queue_signal_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(queue_signal_);
  }
  return true;
}

void CommunicatorImpl::help(const WorkState& work) { run_queued(&work); }

void CommunicatorImpl::progress_loop() {
  using Clock = std::chrono::steady_clock;
  // Named for top -H, gdb and /proc/<pid>/task/*/comm (15 characters at most).
  pthread_setname_np(pthread_self(), "chorus-progress");
  Clock::time_point last_active = Clock::now();
  while (true) {
    uint32_t seen = queue_signal_.load(std::memory_order_acquire);
    bool pending;
    Clock::time_point queued_at;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !queue_.empty();
      if (!pending && stopping_) break;
      if (pending) queued_at = queue_.front().queued_at;
    }
    if (pending) last_active = Clock::now();
    // An operation issued a moment ago is left to its caller for kClaimGrace: one that
    // waits for it runs it itself. Woken by the call, this thread was often scheduled
    // first, on the caller's core or a peer's; it ran the operation while the caller
    // slept until it completed, and with that streak broken enqueue() woke it for the
    // next one too: on one of 2 ranks in a loop of waited 64 KiB allreduces it ran
    // 49,960 of 50,000, with a sleep and a wake-up each. Yielding gives a caller it
    // preempted its core back; an operation nobody waits for starts 50 us later.
    if (pending && last_active - queued_at < kClaimGrace && !abort_requested_.load()) {
      sched_yield();
      continue;
    }
    if ((pending || (abort_requested_.load() && !transport_aborted_)) && run_queued(nullptr)) {
      continue;
    }
    // A caller that waits runs its operation itself (help()). While the last
    // kHelpedStreak operations were all run that way (a caller that waits for each),
    // enqueue() does not wake this thread, which would only take a core from the caller
    // and its peers; the thread naps kHelpedTick instead, so that an operation nobody
    // waits for still starts within a nap. Otherwise (operations issued and not waited
    // for, as DDP's buckets during backward) it sleeps until enqueue() wakes it: naps of
    // a fraction of a millisecond, as this loop once took, woke it some 40 times in
    // every 10 ms training step and took that much from the rank's computation
    // (chorus-mnist, 2 ranks on 2 cores: 26,700 context switches in 305 steps -> 5,700).
    if (Clock::now() - last_active < kProgressLinger &&
        helped_streak_.load(std::memory_order_relaxed) >= kHelpedStreak) {
      futex_wait_change(queue_signal_, seen, Clock::now() + kHelpedTick, std::chrono::microseconds(0));
      continue;
    }
    // Idle: sleep until enqueue() wakes us. Announce the sleep first; a waker that
    // misses the flag has already changed the signal, and then the futex wait returns
    // at once.
    progress_sleeping_.store(true, std::memory_order_seq_cst);
    bool woken = futex_wait_change(queue_signal_, seen, Clock::now() + std::chrono::seconds(1),
                                   std::chrono::microseconds(0));
    progress_sleeping_.store(false, std::memory_order_relaxed);
    // Woken by enqueue(): operations are coming again, even if the caller runs this
    // one itself before we look.
    if (woken) last_active = Clock::now();
  }
}

void CommunicatorImpl::write_trace(const std::string& why) {
  if (!recorder_.enabled() || trace_written_.exchange(true)) return;
  std::string where_to =
      recorder_.dump(options_.trace_dir, rank_, size_, hosts_[rank_], options_.comm_id, why);
  CHORUS_LOG(kWarn, "flight recorder of rank " + std::to_string(rank_) + " written to " + where_to);
}

void CommunicatorImpl::fail_aborted(Op& op) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    reason = abort_reason_;
  }
  if (recorder_.enabled()) recorder_.finished(op.trace_slot, "aborted: " + reason);
  unfinished_.fetch_sub(1, std::memory_order_acq_rel);
  op.work->complete(std::make_exception_ptr(AbortedError(
      op.work->description() + " on " + where() +
      ": the communicator was aborted and cannot be used any more (rebuild it); cause: " +
      reason)));
}

namespace {

// What every rank of a call passes alike (transport::Signature), from its spec.
transport::Signature signature_of(const OpSpec& spec) {
  transport::Signature sig;
  sig.count = spec.agreed_count;
  sig.root = spec.collective ? spec.root : -1;  // a send's peer is not its recv's
  sig.dtype = static_cast<uint8_t>(spec.dtype);
  if (spec.reduces) sig.reduce = static_cast<uint8_t>(spec.op);
  return sig;
}

}  // namespace

void CommunicatorImpl::run(Op& op) {
  if (abort_requested_.load()) return fail_aborted(op);
  transport::OpInfo info;
  info.name = op.spec.name;
  info.code = transport::op_code_of(op.spec.name);
  info.seq = op.seq;
  info.kind = op.spec.collective ? transport::FrameKind::kCollective : transport::FrameKind::kP2P;
  info.deadline = Deadline(options_.timeout);
  info.sig = signature_of(op.spec);
  algorithms::Context ctx{*transport_,
                          rank_,
                          size_,
                          op.spec.dtype,
                          dtype_size(op.spec.dtype),
                          op.spec.reduces ? reduce_function(op.spec.dtype, op.spec.op) : nullptr,
                          op.spec.reduces && op.spec.op == ReduceOp::kAvg,
                          scratch_,
                          options_.segment_bytes,
                          topology_,
                          op.spec.op,
                          shm_.get()};
  if (op.spec.reduces) ctx.reduce_many = reduce_many_function(op.spec.dtype, op.spec.op);
  if (recorder_.enabled()) recorder_.running(op.trace_slot);
  try {
    if (options_.check_consistency && op.spec.collective && size_ > 1) check_consistency(op);
    transport_->begin(info);
    if (shm_) shm_->begin(info);
    op.body(ctx);
    if (recorder_.enabled()) recorder_.finished(op.trace_slot, "");
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    op.work->complete(nullptr);
  } catch (const InvalidArgumentError& e) {
    // Found by all ranks together before any data moved: the communicator stays usable.
    if (recorder_.enabled()) recorder_.finished(op.trace_slot, e.what());
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    op.work->complete(std::current_exception());
  } catch (const std::exception& e) {
    std::string reason = e.what();
    CHORUS_LOG(kError, reason);
    if (recorder_.enabled()) {
      auto* timeout = dynamic_cast<const TimeoutError*>(&e);
      recorder_.finished(op.trace_slot, reason,
                         timeout ? timeout->awaited_ranks() : std::vector<int>{});
    }
    write_trace(reason);
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (!abort_requested_.load()) abort_reason_ = reason;
      abort_requested_.store(true);
    }
    if (shm_) shm_->abort(reason);  // first, as above
    transport_->abort(reason);
    transport_aborted_ = true;
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    if (dynamic_cast<const Error*>(&e) != nullptr) op.work->complete(std::current_exception());
    else op.work->complete(std::make_exception_ptr(SystemError(op.work->description() + ": " + reason)));
  }
}

namespace {

// What CHORUS_DEBUG=DETAIL compares: fixed size, so that the exchange itself matches
// on every rank whatever each one is about to run. The call's signature is the one the
// transports compare (transport.h), so a valid allgatherv or alltoallv, whose send
// counts differ between ranks, agrees here too.
struct Fingerprint {
  uint64_t seq = 0;
  transport::Signature sig;
  uint8_t code = 0;
  bool operator==(const Fingerprint&) const = default;
};

std::string describe(const Fingerprint& f) {
  return transport::describe_call(f.code, nullptr, f.seq, false, f.sig);
}

}  // namespace

void CommunicatorImpl::check_consistency(const Op& op) {
  transport::OpInfo info;
  info.name = "consistency check";
  info.code = transport::kConsistencyCheckCode;
  info.seq = op.seq;
  info.deadline = Deadline(options_.timeout);
  transport_->begin(info);
  Fingerprint mine;  // padding bytes travel too, unread: == compares the fields
  mine.seq = op.seq;
  mine.sig = signature_of(op.spec);
  mine.code = transport::op_code_of(op.spec.name);
  std::vector<Fingerprint> all(size_);
  std::vector<size_t> counts(size_, sizeof(Fingerprint)), displs(size_);
  for (int r = 0; r < size_; ++r) displs[r] = r * sizeof(Fingerprint);
  // Over tcp even where shared memory is used: a mismatch must not reach the segment.
  algorithms::Context ctx{*transport_, rank_,         size_,     DataType::kUInt8, 1, nullptr,
                          false,       scratch_,      options_.segment_bytes, topology_};
  algorithms::allgatherv_ring(ctx, &mine, all.data(), counts, displs);
  bool same = std::all_of(all.begin(), all.end(), [&](const Fingerprint& f) { return f == mine; });
  if (same) return;
  std::string m = "collective mismatch found by CHORUS_DEBUG=DETAIL on " + where() + ":";
  for (int r = 0; r < size_; ++r) m += " rank " + std::to_string(r) + " called " + describe(all[r]) + ";";
  throw InvalidArgumentError(m + " every rank must call the same collectives in the same order");
}

void CommunicatorImpl::abort(const std::string& reason) {
  abort_with("abort() called on " + where() + ": " + reason);
}

void CommunicatorImpl::abort_with(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_requested_.load()) return;
    abort_reason_ = reason;
    abort_requested_.store(true);
  }
  write_trace(reason);
  transport_->interrupt(reason);
  if (shm_) shm_->interrupt(reason);
  queue_signal_.fetch_add(1, std::memory_order_release);
  futex_wake_all(queue_signal_);
}

bool CommunicatorImpl::hierarchical_possible() const {
  return topology_.nodes > 1 && topology_.local_size > 1 && topology_.uniform();
}

Algorithm CommunicatorImpl::algorithm_for(const char* collective, size_t bytes) const {
  const std::string_view c = collective;
  Algorithm forced = options_.algorithm;
  // A forced algorithm that this communicator's shape cannot run falls back to the
  // automatic choice, so that one CHORUS_ALGO serves every communicator of a job.
  if (forced == Algorithm::kHierarchical && !hierarchical_possible()) forced = Algorithm::kAuto;
  if (forced == Algorithm::kShmDirect && !all_in_shared_memory()) forced = Algorithm::kAuto;
  const bool tcp_forced = forced == Algorithm::kRing || forced == Algorithm::kRecursiveDoubling ||
                          forced == Algorithm::kHalvingDoubling;
  const bool shm = all_in_shared_memory() && !tcp_forced;
  if (c == "allreduce") {
    if (forced != Algorithm::kAuto) return forced;
    if (size_ == 1) return Algorithm::kRecursiveDoubling;
    // The choice depends only on the size here: remembered per size (training issues
    // the same few sizes over and over), it costs a small collective nothing.
    std::atomic<uint64_t>& memo = allreduce_choice_[(bytes * 0x9E3779B97F4A7C15u) >> 60];
    const uint64_t seen = memo.load(std::memory_order_relaxed);
    if (seen != 0 && (seen >> 8) == bytes) return static_cast<Algorithm>((seen & 0xff) - 1);
    std::vector<Algorithm> candidates = {Algorithm::kRecursiveDoubling,
                                         Algorithm::kHalvingDoubling, Algorithm::kRing};
    if (all_in_shared_memory()) candidates.push_back(Algorithm::kShmDirect);
    if (hierarchical_possible()) candidates.push_back(Algorithm::kHierarchical);
    Algorithm best = cheapest("allreduce", bytes, shape_, cost_, candidates);
    if (bytes < (uint64_t{1} << 56)) {
      memo.store(bytes << 8 | (static_cast<uint64_t>(best) + 1), std::memory_order_relaxed);
    }
    return best;
  }
  if (c == "broadcast" || c == "allgather") {
    if (forced == Algorithm::kShmDirect || forced == Algorithm::kHierarchical) return forced;
    if (shm) return Algorithm::kShmDirect;
    if (forced == Algorithm::kAuto && hierarchical_possible()) {
      Algorithm flat = c == "broadcast" ? Algorithm::kAuto : Algorithm::kRing;
      const Algorithm candidates[] = {flat, Algorithm::kHierarchical};
      if (cheapest(collective, bytes, shape_, cost_, candidates) == Algorithm::kHierarchical) {
        return Algorithm::kHierarchical;
      }
    }
    if (c == "allgather") return Algorithm::kRing;
  }
  if (c == "broadcast" || c == "reduce") {
    if (c == "reduce" && (forced == Algorithm::kShmDirect || shm)) return Algorithm::kShmDirect;
    if (forced == Algorithm::kRing) return Algorithm::kRing;
    if (forced != Algorithm::kAuto) return Algorithm::kRecursiveDoubling;  // binomial tree
    // Binomial tree while latency dominates, pipelined chain beyond (chorus-bench,
    // 2-8 ranks over loopback).
    return bytes <= 64 * 1024 ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  }
  if (c == "reduce_scatter" || c == "barrier") {
    if (forced == Algorithm::kShmDirect || shm) return Algorithm::kShmDirect;
    return c == "barrier" ? Algorithm::kAuto : Algorithm::kRing;
  }
  if (c == "gather" || c == "scatter" || c == "alltoall" || c == "alltoallv" ||
      c == "allgatherv") {
    // Through shared memory only where the ranks read each other's buffers (their
    // direct algorithms over tcp otherwise); at every size, so that ranks that disagree
    // on the count still take the same path and fail comparing descriptors.
    // alltoallv's ranks also need their tables of counts to fit in a segment buffer.
    const bool table_fits = c != "alltoallv" || shm_ == nullptr ||
                            (1 + 3 * static_cast<size_t>(size_)) * 8 <= shm_->buffer_bytes();
    if ((forced == Algorithm::kShmDirect || shm) && shm_->cma() && table_fits) {
      return Algorithm::kShmDirect;
    }
    return c == "allgatherv" ? Algorithm::kRing : Algorithm::kAuto;
  }
  if (c == "send" || c == "recv") {
    // A peer on this node gets its messages through shared memory (whatever
    // CHORUS_ALGO says); "shm" when every peer is on this node.
    return all_in_shared_memory() ? Algorithm::kShmDirect : Algorithm::kAuto;
  }
  return Algorithm::kAuto;  // pairwise / dissemination: no choice to make
}

std::shared_ptr<Communicator> CommunicatorImpl::split(int color, int key) {
  std::vector<int64_t> mine{color, key}, all(2 * static_cast<size_t>(size_));
  allgather(mine.data(), all.data(), 2, DataType::kInt64).wait();
  uint64_t split_index = split_count_++;
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  CommOptions child = options_;
  child.comm_id = options_.comm_id + "/split" + std::to_string(split_index) + "/color" +
                  std::to_string(color);
  return Communicator::create(user_store_, new_rank, static_cast<int>(members.size()), child);
}

}  // namespace internal

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank,
                                                   int size, CommOptions options) {
  if (!store) throw InvalidArgumentError("Communicator::create: store is null");
  if (size < 1) {
    throw InvalidArgumentError("Communicator::create: size " + std::to_string(size) +
                               " must be at least 1");
  }
  if (rank < 0 || rank >= size) {
    throw InvalidArgumentError("Communicator::create: rank " + std::to_string(rank) +
                               " is out of range [0, " + std::to_string(size) + ")");
  }
  if (options.comm_id.empty()) throw InvalidArgumentError("Communicator::create: empty comm_id");
  // Resolved once per process; a bad CHORUS_REDUCE_ISA fails here (ConfigError), not on
  // the progress thread at the first reduction.
  reduce_isa();
  if (options.segment_bytes < 64) {
    throw InvalidArgumentError("Communicator::create: segment_bytes " +
                               std::to_string(options.segment_bytes) + " is below 64");
  }
  return std::make_shared<internal::CommunicatorImpl>(std::move(store), rank, size,
                                                      std::move(options));
}

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank,
                                                   int size) {
  return create(std::move(store), rank, size, CommOptions::from_env());
}

std::shared_ptr<Communicator> Communicator::from_env() { return from_env(CommOptions::from_env()); }

std::shared_ptr<Communicator> Communicator::from_env(CommOptions options) {
  int size = settings::world_size();
  int rank = settings::rank();
  std::shared_ptr<Store> store = store_from_env(rank, options.connect_timeout);
  // A launcher that restarts the job keeps its store: each attempt meets under its own
  // prefix, so no rank reads an address a dead attempt published.
  int attempt = settings::restart_count();
  if (attempt > 0) {
    store = std::make_shared<PrefixStore>("attempt" + std::to_string(attempt), store);
    store->set_timeout(options.connect_timeout);
  }
  return create(std::move(store), rank, size, std::move(options));
}

}  // namespace chorus
