#include "comm/communicator/communicator_impl.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/cost_model.h"
#include "comm/communicator/stop_traces.h"
#include "comm/reduce/reduce.h"
#include "comm/store/key_ledger.h"
#include "comm/transport/routed_transport.h"
#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "comm/transport/topology.h"

namespace chorus {
namespace communicator {

using store::KeyLedger;
using transport::local_node_id;
namespace {

// A count of the tuning table as an int (CHORUS_COST_MODEL takes any size_t).
int saturated_int(size_t v) { return static_cast<int>(std::min<size_t>(v, INT_MAX)); }

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
  if (!options_.allowlist_file.empty()) {
    tcp.allowlist = std::make_shared<const net::AllowList>(
        net::AllowList::load(options_.allowlist_file, options_.allowlist_source));
  }
  tcp.node_id = local_node_id(options_.node_id);
  cost_ = parse_cost_params(options_.cost_model);
  // One exchange through the store gives every rank's address, host and node (the
  // roster, transport/roster.h); no connection is opened until it is used.
  std::vector<std::string> nodes;
  transport_ = transport::tcp::connect_mesh(scoped, rank_, size_, tcp, &nodes);
  for (int r = 0; r < size_; ++r) hosts_.push_back(transport_->host_of(r));
  topology_ = transport::topology_from_ids(nodes, rank_);
  if (size_ > 1) prove_token_around_the_ring();
  connect_shared_memory(scoped);
  shape_.size = size_;
  shape_.nodes = topology_.nodes;
  shape_.local_size = topology_.local_size;
  shape_.shm = shm_ != nullptr;
  shape_.hierarchical = hierarchical_possible();
  if (shm_) shape_.shm_chunk = shm_->buffer_bytes();
  shape_.segment_bytes = options_.segment_bytes;
  finish_creation(*ledger);
  // Every rank on this node and no core left over for the progress threads (the ranks'
  // own threads, one computing each, take them all).
  const algorithms::Tuning& t = cost_.tuning;
  engine_.set_claim_grace(std::chrono::microseconds(t.claim_grace_us));
  if (all_in_shared_memory() && shm_->no_spare_core()) {
    engine_.set_no_spare_core(std::chrono::microseconds(t.no_spare_core_claim_grace_us));
  }
  engine_.start();
  // CHORUS_DEBUG=INFO (or CHORUS_LOG_LEVEL=info): how this communicator was set up.
  CHORUS_LOG(kInfo, "communicator set up on " << where() << ": "
                                     << size_ << " ranks on " << topology_.nodes << " node(s), "
                                     << topology_.local_size << " on this one, which talk over "
                                     << (!shm_ ? "tcp"
                                         : topology_.nodes > 1 ? "shared memory (tcp to the other nodes)"
                                                               : "shared memory")
                                     << "; algorithm "
                                     << algorithm_name(options_.algorithm) << ", reduce kernels "
                                     << reduce_isa_name(reduce_isa()) << ", timeout "
                                     << options_.timeout.count() << " ms");
  // Last: nothing after it throws, so the destructor, which removes it, runs.
  if (recorder_.enabled()) {
    stop_trace_id_ = add_stop_trace([this](const std::string& why) {
      if (recorder_.recorded() > 0) write_trace(where() + ": " + why);
    });
  }
}

transport::OpInfo CommunicatorImpl::creation_op() const {
  transport::OpInfo info;
  info.name = "creation barrier";
  info.code = transport::wire_code(Collective::kBarrier);
  // A number of its own, not the first collective's (0): a rank slow in creation tells
  // the peer it waits for so in a waiting frame, which that peer may read only in its
  // first collective (over tcp, streams open during creation and a slow rank is
  // common); numbered 0 it would read as a call of another kind under its own number 0.
  // Frames carry the low 32 bits; the call history forgets this call long before a
  // collective is numbered so.
  info.seq = UINT32_MAX;
  info.deadline = Deadline(options_.connect_timeout);
  return info;
}

void CommunicatorImpl::prove_token_around_the_ring() {
  // Streams open by use, and a node's ranks talk through shared memory: nothing else
  // would make two ranks of one node, or two that never exchange, prove the job token
  // to each other, as the full mesh made every pair. Each rank opens its tcp stream to
  // the next one (an empty frame), and every stream proves the token both ways: ranks
  // whose tokens differ fail here, and the ring links every rank to every other.
  transport_->begin(creation_op());
  uint8_t none = 0;
  try {
    transport_->isend((rank_ + 1) % size_, &none, 0);
    transport_->irecv((rank_ + size_ - 1) % size_, &none, 0);
    transport_->wait_all();
  } catch (const Error& e) {
    // A peer connecting to this rank reads why in the refusal (the token, named).
    transport_->abort(e.what());
    throw;
  }
}

void CommunicatorImpl::finish_creation(KeyLedger& ledger) {
  // Once every rank is here, every rank has read all that the others published: a
  // barrier (a few zero-byte frames), then each deletes the keys it wrote.
  if (size_ > 1) {
    transport_->begin(creation_op());
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
  config.try_cma = options_.shm_cma != CommOptions::CrossMemoryAttach::kOff;
  config.cma_any_size = options_.shm_cma == CommOptions::CrossMemoryAttach::kAnyNode;
  config.spins = saturated_int(cost_.tuning.shm_spins);
  config.oversubscribed_yields = saturated_int(cost_.tuning.shm_oversubscribed_yields);
  config.oversubscribed_spins = saturated_int(cost_.tuning.shm_oversubscribed_spins);
  std::string why_not;
  shm_ = transport::shm::ShmGroup::connect(scoped, config, why_not);
  if (shm_) {
    // From here on every message goes by its peer: this node's ranks through shared
    // memory, the others over tcp.
    std::vector<bool> on_node(size_, false);
    for (int r : config.members) on_node[r] = true;
    transport_ = std::make_unique<transport::RoutedTransport>(
        std::move(transport_), std::make_unique<transport::shm::ShmTransport>(*shm_, size_),
        std::move(on_node));
    return;
  }
  std::string message = "shared memory between the " + std::to_string(topology_.local_size) +
                        " ranks of this node could not be set up: " + why_not;
  if (options_.transport == TransportKind::kShm) {
    throw SystemError("creating communicator '" + options_.comm_id + "' on " + where() + ": " +
                      message + " (CHORUS_TRANSPORT=shm)");
  }
  CHORUS_LOG(kWarn, message + "; using tcp inside the node");
}

CommunicatorImpl::~CommunicatorImpl() {
  // First: a SIGTERM's writing thread may be inside write_trace() until this returns.
  if (stop_trace_id_ != 0) remove_stop_trace(stop_trace_id_);
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
  // The progress thread runs what is still queued (each fails at once after an abort),
  // then ends.
  engine_.stop();
  if (!transport_aborted_) transport_->close();  // shared memory's too
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
          std::string(collective_name(spec.what)) + " on " + where() +
          ": issued while another thread was issuing an operation on this communicator "
          "(found by CHORUS_DEBUG=DETAIL); the ranks must issue operations in one order, so "
          "issue them from one thread or order the threads yourself");
    }
  }
  std::shared_ptr<WorkState> work;
  // Collectives (stream 0) and sends/receives (stream 1) are numbered apart. Under the
  // engine's lock: the flight recorder's slots follow the order of the queue.
  engine_.enqueue(is_p2p(spec.what) ? 1 : 0, [&](uint64_t seq, std::chrono::steady_clock::time_point at) {
    Op op = make_op(spec, seq, at, std::move(body));
    work = op.work;
    return op;
  });
  return Work(work);
}

Operation CommunicatorImpl::make_op(const OpSpec& spec, uint64_t seq,
                                    std::chrono::steady_clock::time_point at, OpBody body,
                                    bool started) {
  auto work = std::make_shared<WorkState>(collective_name(spec.what), seq, weak_from_this());
  if (spec.source) work->set_source_slot(spec.source);
  size_t slot = 0;
  if (recorder_.enabled()) {
    slot = started ? recorder_.started(seq, spec.what, spec.dtype, spec.count, spec.root, at)
                   : recorder_.queued(seq, spec.what, spec.dtype, spec.count, spec.root, at);
  }
  unfinished_.fetch_add(1, std::memory_order_acq_rel);
  return Op{spec, seq, std::move(body), std::move(work), slot};
}

void CommunicatorImpl::help(const WorkState& work) { engine_.help(work); }

void CommunicatorImpl::on_abort() {
  if (transport_aborted_) return;  // by run(), when an operation failed
  std::lock_guard<std::mutex> lock(abort_mutex_);
  // The routed transport aborts shared memory first: it tells the local peers at once,
  // while tcp's abort lingers up to half a second for its peers to hang up.
  transport_->abort(abort_reason_);
  transport_aborted_ = true;
}

const std::string& CommunicatorImpl::host_of(int rank) const { return hosts_.at(rank); }

std::string CommunicatorImpl::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (host " +
         hosts_[rank_] + ", communicator '" + options_.comm_id + "')";
}

void CommunicatorImpl::write_trace(const std::string& why) {
  if (!recorder_.enabled() || trace_written_.exchange(true)) return;
  std::string where_to =
      recorder_.dump(options_.trace_dir, rank_, size_, hosts_[rank_], options_.comm_id, why);
  // One line on the console; the operations are in the file (chorus-trace merges them).
  CHORUS_LOG(kWarn, "flight recorder of rank " + std::to_string(rank_) + ": " +
                        recorder_.summary() + "; full trace in " + where_to);
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

// What every rank of a call passes alike (transport::Signature), from its spec.
transport::Signature signature_of(const OpSpec& spec) {
  transport::Signature sig;
  sig.count = spec.agreed_count;
  sig.root = is_p2p(spec.what) ? -1 : spec.root;  // a send's peer is not its recv's
  sig.dtype = static_cast<uint8_t>(spec.dtype);
  if (spec.reduces) sig.reduce = static_cast<uint8_t>(spec.op);
  sig.tag = spec.tag;
  return sig;
}

transport::OpInfo CommunicatorImpl::op_info(const OpSpec& spec, uint64_t seq,
                                            std::chrono::steady_clock::time_point started) const {
  transport::OpInfo info;
  info.name = collective_name(spec.what);
  info.code = transport::wire_code(spec.what);
  info.seq = seq;
  info.kind = is_p2p(spec.what) ? transport::FrameKind::kP2P : transport::FrameKind::kCollective;
  info.deadline = Deadline::at(started + options_.timeout);
  info.sig = signature_of(spec);
  return info;
}

algorithms::Context CommunicatorImpl::context_for(const OpSpec& spec) {
  return algorithms::Context{*transport_,
                             rank_,
                             size_,
                             spec.dtype,
                             dtype_size(spec.dtype),
                             spec.reduces ? reduce_function(spec.dtype, spec.op) : nullptr,
                             spec.reduces && spec.op == ReduceOp::kAvg,
                             scratch_,
                             options_.segment_bytes,
                             topology_,
                             spec.op,
                             shm_.get(),
                             spec.reduces ? reduce_many_function(spec.dtype, spec.op) : nullptr,
                             cost_.tuning};
}

void CommunicatorImpl::run(Op& op) {
  if (abort_requested_.load()) return fail_aborted(op);
  algorithms::Context ctx = context_for(op.spec);
  if (op.begun) {  // begun at issue (issue_inline()), with the deadline it had there
    execute(op, [&] { op.body(ctx); });
    return;
  }
  // One reading of the clock for the deadline and the flight recorder.
  const auto started = std::chrono::steady_clock::now();
  const transport::OpInfo info = op_info(op.spec, op.seq, started);
  if (recorder_.enabled()) recorder_.running(op.trace_slot, started);
  execute(op, [&] {
    if (options_.check_consistency && !is_p2p(op.spec.what) && size_ > 1) {
      check_consistency(op, info);
    }
    transport_->begin(info);  // shared memory's too
    op.body(ctx);
  });
}

void CommunicatorImpl::fail(Op& op, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgumentError& e) {
    // Found by all ranks together before any data moved: the communicator stays usable.
    if (recorder_.enabled()) recorder_.finished(op.trace_slot, e.what());
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    op.work->complete(error);
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
    transport_->abort(reason);  // shared memory's first: it tells the local peers at once
    transport_aborted_ = true;
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    if (dynamic_cast<const Error*>(&e) != nullptr) op.work->complete(error);
    else op.work->complete(std::make_exception_ptr(SystemError(op.work->description() + ": " + reason)));
  } catch (...) {
    fail(op, std::make_exception_ptr(SystemError(op.work->description() + " on " + where() +
                                                 ": failed with an exception of unknown type")));
  }
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
  transport_->interrupt(reason);  // shared memory's too
  engine_.wake();
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

}  // namespace communicator

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
  communicator::parse_cost_params(options.cost_model);  // ConfigError before any connection
  if (options.segment_bytes < 64) {
    throw InvalidArgumentError("Communicator::create: segment_bytes " +
                               std::to_string(options.segment_bytes) + " is below 64");
  }
  return std::make_shared<communicator::CommunicatorImpl>(std::move(store), rank, size,
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
