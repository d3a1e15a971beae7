#include "comm/core/communicator_impl.h"

#include <algorithm>
#include <numeric>

#include "chorus/error.h"
#include "comm/common/event.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/core/reduce.h"
#include "comm/transport/tcp/tcp_transport.h"

namespace chorus {
namespace internal {
namespace {

// Pipelining unit of the ring and chain algorithms: large enough that per-message
// costs vanish, small enough that a segment stays in cache while it is reduced.
constexpr size_t kSegmentBytes = 512 * 1024;

// The host the store lives on, when it is a TCP store (possibly behind prefixes).
std::string store_host(Store* store) {
  while (auto* prefixed = dynamic_cast<PrefixStore*>(store)) store = prefixed->base().get();
  if (auto* tcp = dynamic_cast<TcpStore*>(store)) return tcp->host();
  return "";
}

std::string choose_listen_address(const CommOptions& options, Store* store) {
  if (!options.listen_address.empty()) return options.listen_address;
  std::string host = store_host(store);
  if (!host.empty()) {
    std::string local = net::local_address_towards(host);
    if (!local.empty()) return local;
  }
  return "127.0.0.1";
}

}  // namespace

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size,
                                   CommOptions options)
    : rank_(rank), size_(size), options_(std::move(options)), user_store_(std::move(store)) {
  PrefixStore scoped("chorus/comm/" + options_.comm_id, user_store_);
  transport::tcp::TcpOptions tcp;
  tcp.listen_address = choose_listen_address(options_, user_store_.get());
  tcp.comm_id = options_.comm_id;
  tcp.token = options_.job_token;
  tcp.connect_timeout = options_.connect_timeout;
  transport_ = transport::tcp::connect_mesh(scoped, rank_, size_, tcp);
  for (int r = 0; r < size_; ++r) hosts_.push_back(transport_->host_of(r));
  thread_ = std::thread([this] { progress_loop(); });
}

CommunicatorImpl::~CommunicatorImpl() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_signal_.fetch_add(1, std::memory_order_release);
  futex_wake_all(queue_signal_);
  if (thread_.joinable()) thread_.join();
  if (!transport_aborted_) transport_->close();
}

const std::string& CommunicatorImpl::host_of(int rank) const { return hosts_.at(rank); }

std::string CommunicatorImpl::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (host " +
         hosts_[rank_] + ", communicator '" + options_.comm_id + "')";
}

Work CommunicatorImpl::enqueue(const OpSpec& spec, OpBody body) {
  std::shared_ptr<WorkState> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t seq = spec.collective ? next_collective_++ : next_p2p_++;
    std::string desc = std::string(spec.name) + " #" + std::to_string(seq);
    work = std::make_shared<WorkState>(desc, weak_from_this());
    queue_.push_back(Op{spec, seq, std::move(body), work});
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
  }
  if (abort_requested_.load() && !transport_aborted_) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    transport_->abort(abort_reason_);
    transport_aborted_ = true;
  }
  running_.store(false, std::memory_order_release);
  bool left_behind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left_behind = !queue_.empty();
  }
  if (left_behind && until != nullptr) wake_progress_thread();
  return true;
}

void CommunicatorImpl::help(const WorkState& work) { run_queued(&work); }

void CommunicatorImpl::progress_loop() {
  while (true) {
    uint32_t seen = queue_signal_.load(std::memory_order_acquire);
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !queue_.empty();
      if (!pending && stopping_) break;
    }
    if ((pending || (abort_requested_.load() && !transport_aborted_)) && run_queued(nullptr)) {
      continue;
    }
    // Idle, or another thread is running operations: it wakes us if it leaves any.
    // Announce the sleep first; a waker that misses the flag has already changed the
    // signal, and then the futex wait returns at once.
    progress_sleeping_.store(true, std::memory_order_seq_cst);
    futex_wait_change(queue_signal_, seen,
                      std::chrono::steady_clock::now() + std::chrono::seconds(1),
                      std::chrono::microseconds(0));
    progress_sleeping_.store(false, std::memory_order_relaxed);
  }
}

void CommunicatorImpl::fail_aborted(Op& op) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    reason = abort_reason_;
  }
  op.work->complete(std::make_exception_ptr(AbortedError(
      op.work->description() + " on " + where() +
      ": the communicator was aborted and cannot be used any more (rebuild it); cause: " +
      reason)));
}

void CommunicatorImpl::run(Op& op) {
  if (abort_requested_.load()) return fail_aborted(op);
  transport::OpInfo info;
  info.name = op.spec.name;
  info.code = transport::op_code_of(op.spec.name);
  info.seq = op.seq;
  info.kind = op.spec.collective ? transport::FrameKind::kCollective : transport::FrameKind::kP2P;
  info.deadline = Deadline(options_.timeout);
  transport_->begin(info);
  algorithms::Context ctx{*transport_,
                          rank_,
                          size_,
                          op.spec.dtype,
                          dtype_size(op.spec.dtype),
                          op.spec.reduces ? reduce_function(op.spec.dtype, op.spec.op) : nullptr,
                          op.spec.reduces && op.spec.op == ReduceOp::kAvg,
                          scratch_,
                          kSegmentBytes};
  try {
    op.body(ctx);
    op.work->complete(nullptr);
  } catch (const InvalidArgumentError&) {
    // Found by all ranks together before any data moved: the communicator stays usable.
    op.work->complete(std::current_exception());
  } catch (const std::exception& e) {
    std::string reason = e.what();
    CHORUS_LOG(kError, reason);
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (!abort_requested_.load()) abort_reason_ = reason;
      abort_requested_.store(true);
    }
    transport_->abort(reason);
    transport_aborted_ = true;
    if (dynamic_cast<const Error*>(&e) != nullptr) op.work->complete(std::current_exception());
    else op.work->complete(std::make_exception_ptr(SystemError(op.work->description() + ": " + reason)));
  }
}

void CommunicatorImpl::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (abort_requested_.load()) return;
    abort_reason_ = "abort() called on " + where() + ": " + reason;
    abort_requested_.store(true);
  }
  transport_->interrupt(reason);
  queue_signal_.fetch_add(1, std::memory_order_release);
  futex_wake_all(queue_signal_);
}

Algorithm CommunicatorImpl::algorithm_for(const char* collective, size_t bytes) const {
  std::string c = collective;
  Algorithm forced = options_.algorithm;
  if (c == "allreduce") {
    if (forced != Algorithm::kAuto) return forced;
    // Measured with chorus-bench on 2 and 4 ranks over loopback (2 cores): recursive
    // doubling wins up to 32 KiB; on 2 ranks halving-doubling (one exchange each way,
    // no segmenting overhead) up to 1 MiB; the pipelined ring beyond. Issue 5's cost
    // model replaces these thresholds.
    if (bytes <= 32 * 1024 || size_ == 1) return Algorithm::kRecursiveDoubling;
    if (size_ == 2 && bytes <= 1024 * 1024) return Algorithm::kHalvingDoubling;
    return Algorithm::kRing;
  }
  if (c == "broadcast" || c == "reduce") {
    if (forced == Algorithm::kRing) return Algorithm::kRing;
    if (forced != Algorithm::kAuto) return Algorithm::kRecursiveDoubling;  // binomial tree
    return bytes <= 64 * 1024 ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
  }
  if (c == "allgather" || c == "allgatherv" || c == "reduce_scatter") return Algorithm::kRing;
  return Algorithm::kAuto;  // direct / pairwise / dissemination: no choice to make
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
  return std::make_shared<internal::CommunicatorImpl>(std::move(store), rank, size,
                                                      std::move(options));
}

std::shared_ptr<Communicator> Communicator::from_env(CommOptions options) {
  int size = settings::world_size();
  int rank = settings::rank();
  std::shared_ptr<Store> store = store_from_env(rank);
  // A launcher that restarts the job keeps its store: each attempt meets under its own
  // prefix, so no rank reads an address a dead attempt published.
  int attempt = settings::restart_count();
  if (attempt > 0) {
    store = std::make_shared<PrefixStore>("attempt" + std::to_string(attempt), store);
    store->set_timeout(settings::connect_timeout());
  }
  return create(std::move(store), rank, size, std::move(options));
}

}  // namespace chorus
