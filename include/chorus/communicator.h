// The communicator: a group of `size` ranks that run collectives together.
//
// Creation is collective: every rank of the group calls create() (or from_env()) with
// the same store and options, and each returns once the group is fully connected.
//
// Threading: the issuing calls (allreduce, ...) may be made from any thread, but the
// ranks must issue the same collectives in the same order. Each call checks its
// arguments, queues the operation for the communicator's progress thread and returns a
// Work at once. Operations complete in issue order.
//
// Buffers: `send`/`recv` pointers are raw memory owned by the caller; they must stay
// valid until the Work completes. A count of 0 allows null pointers, and so does a
// buffer a rank does not use (broadcast's send, gather's recv and scatter's send on
// ranks other than the root; reduce's recv on non-roots). "In place" is spelled as in
// NCCL: pass the same pointer for allreduce, broadcast, reduce and alltoall; for
// allgather send == recv + rank*count; for allgatherv send == recv + displs[rank];
// for reduce_scatter recv == send + rank*recv_count; for gather on the root
// send == recv + root*count; for scatter on the root recv == send + root*count.
//
// Errors: argument errors throw InvalidArgumentError from the issuing call, before any
// byte is sent, and leave the communicator usable. The one check that needs every
// rank (alltoallv's counts) fails through the Work, on every rank, also leaving the
// communicator usable (the recv buffer's blocks are then unspecified). A failure
// during an operation (a dead or misbehaving peer, a timeout) is reported through the
// Work, names the operation, its sequence number, the peer's rank and host, and aborts
// the communicator: queued and later operations fail at once with AbortedError.
//
// Calls that disagree between ranks (another collective at the same place in the
// order, or the same one with another dtype, count, reduction op or root; a recv of
// another dtype or count than its send; for allgatherv, other recv_counts) fail with
// PeerError and abort the communicator, since data may have moved (partly, into
// buffers) before the disagreement showed. Every tcp frame header and shared-memory
// descriptor carries the sender's call, the receiver compares it with its own, and the
// rank that finds a difference aborts, which fails the ranks waiting for it. The
// message starts with the operation and its sequence number and names both ranks and
// both calls: "allreduce #7 failed on rank 1 (host h): mismatch with rank 0 (host h):
// rank 0 called allreduce #7 with f64 × 1000, sum; this rank called allreduce #7 with
// f32 × 2000, sum (...)"; a rank that learns it from that rank's abort has the same
// after "rank 1 (host h, ...) aborted: ". A disagreement that no frame shows (ranks that
// each wait for the other under different roots, and send nothing) is found after
// 100 ms of waiting, when a waiting rank tells the peers it waits for which call it is
// in and checks the first frame of its other peers.
//
// One case completes before it can know: a rank whose part of the call only sends, or
// receives only from ranks that made the same call (over tcp: the root of a broadcast
// or scatter; a broadcast rank whose path from the root it named agreed with it; a
// reduce or gather rank that only sends; the sender of a send()). Its result is the one
// its own call asked for (nothing it holds came from a disagreeing rank), and the call
// completes once its data is with the transport. Its next call that waits for a peer
// fails with PeerError naming the mismatch (a send that fits the socket buffers or the
// shared-memory ring does not wait). Over shared memory, every rank of a collective
// compares descriptors before any data moves and fails the call itself; a send there
// completes as over tcp.
//
// Completion: a Work completes when this rank's part is done and its buffers may be
// reused. A send over tcp can complete once the kernel holds its bytes, before the
// receiver looked at them; if the receiver then fails the matching recv (a mismatch,
// say) it aborts, and this rank learns it at its next operation, which fails naming
// the receiver and its reason.
//
// Destruction is local, not collective: each rank drops its communicator when it is
// done, without waiting for the others. Dropping the last reference with nothing pending
// says goodbye to the peers (their operations that need this rank fail naming it as
// gone). With operations still pending (issued and not complete, whether waited for
// or not) it does not wait for them: it aborts them, logs a warning, tells the peers,
// and returns within about half a second (tcp lingers that long for the peers to hang
// up). The pending Works fail with AbortedError saying the communicator was destroyed
// with N operations pending; a peer's operations that need this rank fail with
// PeerError naming it and that reason. Wait for every Work you need first.
//
// The caller's duties (chorus does not check them, or checks only in a debug mode):
// - Averages (ReduceOp::kAvg) are the sum divided by the size, computed in the element
//   type: integer and float16/bfloat16 sums overflow as they would in that type (int8
//   100 on each of 3 ranks sums to 300, wraps to 44, averages to 14), and integer
//   division truncates. Reduce in a wider type where that matters.
// - Every rank issues the same operations in the same order. Issuing from several
//   threads at once orders them differently on each rank: two allreduces of the same
//   shape then exchange each other's data, with no error. CHORUS_DEBUG=DETAIL catches
//   calls that overlap in time (an issuing call that finds another thread inside one
//   fails with InvalidArgumentError); calls that only interleave differently cannot be
//   seen from inside one rank. Issue from one thread, or order the threads yourself.
// - Buffers stay valid and untouched until their Work completes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/defaults.h"
#include "chorus/shared_memory.h"
#include "chorus/store.h"
#include "chorus/topology.h"
#include "chorus/types.h"
#include "chorus/work.h"

namespace chorus {

// Algorithms that can be forced with CommOptions::algorithm or CHORUS_ALGO.
enum class Algorithm : uint8_t {
  kAuto,                // chosen by message size
  kRing,                // bandwidth-optimal, chunked and pipelined
  kRecursiveDoubling,   // latency-optimal for small messages
  kHalvingDoubling,     // reduce-scatter + allgather by recursive halving/doubling
  kShmDirect,           // ranks of one node through shared memory, each reducing a slice
  kHierarchical,        // intra-node reduce-scatter, inter-node allreduce, intra-node allgather
  kBinomialTree,        // broadcast and reduce along a binomial tree (latency-optimal)
  kBruck,               // allgather in ceil(log2 N) rounds of doubling blocks (latency-optimal)
};
// The algorithm's name as CHORUS_ALGO spells it ("auto", "ring", "rd", "hd", "shm",
// "hier", "tree", "bruck"); "?" for a value the enum does not name.
const char* algorithm_name(Algorithm algorithm);
// The algorithm a CHORUS_ALGO name (or its long form: "recursive_doubling",
// "halving_doubling", "direct", "hierarchical", "binomial_tree") names; nullopt for any
// other string.
std::optional<Algorithm> parse_algorithm(std::string_view name);

// How ranks of one node talk (CommOptions::transport, CHORUS_TRANSPORT).
enum class TransportKind : uint8_t {
  kAuto,  // shared memory inside a node, tcp across nodes
  kTcp,   // tcp everywhere, also inside a node
  kShm,   // like kAuto, but failing to set up shared memory is an error, not a fallback
};

struct CommOptions {
  // The defaults below are those of an empty environment; from_env() reads it.
  // Deadline of each operation (CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT, else 30 min).
  std::chrono::milliseconds timeout{kDefaultTimeout};
  // Deadline to connect the group (CHORUS_CONNECT_TIMEOUT, else HCCL_CONNECT_TIMEOUT,
  // else 120 s).
  std::chrono::milliseconds connect_timeout{kDefaultConnectTimeout};
  // Forced algorithm (CHORUS_ALGO), kAuto to choose by size.
  Algorithm algorithm = Algorithm::kAuto;
  // Transport between ranks of one node (CHORUS_TRANSPORT).
  TransportKind transport = TransportKind::kAuto;
  // Whether the ranks of a node in shared memory read each other's buffers by
  // cross-memory attach (process_vm_readv, where the kernel allows it) for the sizes and
  // collectives where that measured faster (CHORUS_SHM_CMA = 0, 1, all): kOff: never,
  // every byte through the segment; kPairs: in nodes of two ranks, the default;
  // kAnyNode: in nodes of any number of ranks (docs/environment.md).
  enum class CrossMemoryAttach : uint8_t { kOff, kPairs, kAnyNode };
  CrossMemoryAttach shm_cma = CrossMemoryAttach::kPairs;
  // Whether collectives on node-shared buffers (shared_memory.h) take the direct path
  // (CHORUS_SHM_DIRECT = 1, the default, or 0). Every rank of a node must agree.
  bool shm_direct = true;
  // Whether a small allreduce on one node in shared memory (up to 4 KiB, or 256 KiB on
  // node-shared buffers) may run on the calling thread as it is issued, when nothing
  // else is queued (CHORUS_SHM_INLINE = 1, the default, or 0): it then waits for its
  // peers to enter the call only a few microseconds before leaving the rest to the
  // queue, so issuing never waits on what a peer issues later. Ranks may differ: both
  // ways run the same exchange.
  bool shm_inline = true;
  // The cost model that chooses algorithms (CHORUS_COST_MODEL): comma-separated
  // key=value pairs over its built-in parameters (tcp_alpha_us, tcp_gbps, shm_alpha_us,
  // shm_gbps, reduce_gbps); empty: the built-in ones. create() throws ConfigError on an
  // unknown key or a value that is not a positive number.
  std::string cost_model;
  // The allow-list of peer addresses (docs/security.md): a file of addresses and CIDR
  // blocks; the data connections of every other address are refused. Empty: every
  // address. `allowlist_source` names what set it in messages; from_env() reads
  // CHORUS_WHITELIST_FILE, else HCCL_WHITELIST_FILE unless HCCL_WHITELIST_DISABLE=1.
  // create() throws ConfigError for a file it cannot read or parse.
  std::string allowlist_file;
  std::string allowlist_source = "CommOptions::allowlist_file";
  // Node identity (CHORUS_NODE_ID); empty: the hostname and the boot id. Ranks with the
  // same identity share memory.
  std::string node_id;
  // Compare every collective's fingerprint (sequence number, collective, dtype, count,
  // op, root) across ranks before it runs; a mismatch fails the collective on every
  // rank with InvalidArgumentError listing what each rank called (CHORUS_DEBUG=DETAIL).
  // Costs one small allgather per collective; off by default.
  bool check_consistency = false;
  // Flight recorder: operations kept (CHORUS_TRACE_BUFFER_SIZE, 0: off) and the
  // directory they are written to on a timeout or abort (CHORUS_TRACE_DIR; empty:
  // $TMPDIR/chorus-traces-<uid>, /tmp when TMPDIR is unset). The console gets one line
  // naming the file. apps/chorus-trace merges the ranks' files.
  size_t trace_buffer_size = kDefaultTraceBufferSize;
  std::string trace_dir;
  // Pipelining unit of the ring and chain algorithms over tcp, bytes
  // (CHORUS_SEGMENT_BYTES, default 2 MiB). Every rank must use the same value (ranks
  // that differ fail with a mismatched-message error). Large enough that per-message
  // costs vanish; over tcp on one machine the kernel's copies are the transfer, so
  // smaller segments only add stalls there; across machines they let the reduction of
  // one segment overlap the wire time of the next.
  size_t segment_bytes = kDefaultSegmentBytes;
  // Shared secret of the job (CHORUS_JOB_TOKEN): every data connection proves it holds
  // it by challenge and response (it is never sent); ranks whose tokens differ refuse
  // each other with a PeerError naming CHORUS_JOB_TOKEN. The store has its own (see
  // TcpStore), read from the same variable.
  std::string job_token;
  // Name of this communicator in the store; ranks of different communicators sharing a
  // store must use different names.
  std::string comm_id = "world";
  // Address to listen on and publish. Empty: chosen from CHORUS_IF_IP /
  // CHORUS_SOCKET_IFNAME (or HCCL_IF_IP / HCCL_SOCKET_IFNAME), else the local address
  // that routes to the store's host, else 127.0.0.1.
  std::string listen_address;

  // Options with every default read from the environment. Throws ConfigError on a bad
  // value, naming the variable.
  static CommOptions from_env();
  // The same for a front end that takes a timeout of its own (torch_chorus's
  // init_process_group, chorus_torch's ProcessGroup::from_env(timeout)): `timeout` is
  // the deadline of each operation unless CHORUS_TIMEOUT (else HCCL_EXEC_TIMEOUT) is
  // set. That variable is the operator's override, as HCCL_EXEC_TIMEOUT is for HCCL: it
  // applies, and where it differs from `timeout`, one warning line on stderr names
  // both values and says that it applies.
  static CommOptions from_env(std::chrono::milliseconds timeout);
};

// Shared by receives from any source issued on several communicators (c10d's two
// send/recv communicators, say) that must take one message between them: the first
// receive to find a matching message takes it, and the others then complete without
// one (Work::source() -1), leaving what they found for later receives. A receive whose
// sources can no longer send it a message (they left, or went on to a later collective
// on its communicator) waits for the claim to be taken elsewhere rather than failing;
// if nobody takes it, it times out at the operation's deadline.
class RecvClaim {
 public:
  // True for the first caller only.
  bool try_take() { return !taken_.exchange(true, std::memory_order_acq_rel); }
  bool taken() const { return taken_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> taken_{false};
};

class Communicator {
 public:
  // Connects rank `rank` of a group of `size` through `store`. Throws
  // InvalidArgumentError for a bad rank/size, TimeoutError when the group is not
  // complete within options.connect_timeout, PeerError when a handshake is refused
  // (naming the field that did not match), ConfigError when the ranks were given
  // different sizes (every rank names both) or this process's file-descriptor limit
  // cannot hold the group. The keys creation writes in `store` are deleted before it
  // returns (a store that cannot delete keeps them): a job that creates or splits
  // communicators every step does not grow its store.
  //
  // How large a group can be: each rank holds two tcp sockets per peer, and up to 256
  // more while it starts, so RLIMIT_NOFILE must allow about 2 * size + 320 descriptors
  // (checked before anything is published; the soft limit is raised to the hard one
  // where that is enough). Linux caps the limit at fs.nr_open (1048576 by default),
  // about 524000 ranks. Every rank also reads every other rank's address from the
  // store, size * size reads in all: 70000 of them took 2.8 s from one loopback TcpStore.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommOptions options);
  // The same with CommOptions::from_env(): reads the environment when called, and throws
  // ConfigError naming a variable with a bad value.
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size);

  // The `env://` start-up: RANK, WORLD_SIZE (both default to a 1-rank job when
  // neither is set), MASTER_ADDR, MASTER_PORT (or CHORUS_STORE_ADDR, CHORUS_STORE_PORT
  // where a launcher hosts the store); see store_from_env().
  // Its store's connect deadline and timeout are options.connect_timeout. Without
  // options: CommOptions::from_env(), as create() above.
  static std::shared_ptr<Communicator> from_env(CommOptions options);
  static std::shared_ptr<Communicator> from_env();

  // See "Destruction" above: pending operations are aborted, not waited for.
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;
  // Host name of `rank` as it published it.
  virtual const std::string& host_of(int rank) const = 0;
  // Which ranks share a node, found at creation.
  virtual const Topology& topology() const = 0;

  // Node-shared memory for the direct path of collectives (shared_memory.h): the same
  // as chorus::allocate_shared(bytes), local, no communication.
  static std::shared_ptr<SharedBuffer> allocate_shared(size_t bytes) {
    return chorus::allocate_shared(bytes);
  }
  // Whether collectives on node-shared buffers can take the direct path here: more than
  // one rank, all on this node and meeting in shared memory (not CHORUS_TRANSPORT=tcp,
  // nor shared memory that could not be set up), CommOptions::shm_direct on and no flat
  // algorithm forced. The same on every rank of a group created with the same options,
  // so ranks can decide by it alone to allocate the buffers of their collectives with
  // allocate_shared() (as chorus_torch's DistributedDataParallel does for its buckets).
  virtual bool direct_path_possible() const = 0;

  // recv = op over ranks of send (count elements each).
  virtual Work allreduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) = 0;
  Work allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
    return allreduce(buf, buf, count, dtype, op);
  }
  // recv on every rank = send of `root` (send is read only on root).
  virtual Work broadcast(const void* send, void* recv, size_t count, DataType dtype,
                         int root) = 0;
  Work broadcast(void* buf, size_t count, DataType dtype, int root) {
    return broadcast(buf, buf, count, dtype, root);
  }
  // recv on `root` = op over ranks of send; recv is not touched on other ranks.
  virtual Work reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                      int root) = 0;
  // recv[r*count ...] = send of rank r.
  virtual Work allgather(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // recv holds the blocks of every rank, rank r's block of recv_counts[r] elements at
  // displs[r] (empty displs: packed in rank order). send_count must equal
  // recv_counts[rank].
  virtual Work allgatherv(const void* send, size_t send_count, void* recv,
                          std::span<const size_t> recv_counts, std::span<const size_t> displs,
                          DataType dtype) = 0;
  // recv (recv_count elements) = op over ranks of block `rank` of send
  // (size*recv_count elements).
  virtual Work reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                              ReduceOp op) = 0;
  // On root, recv[r*count ...] = send of rank r.
  virtual Work gather(const void* send, void* recv, size_t count, DataType dtype, int root) = 0;
  // recv on rank r = block r of root's send (size*count elements).
  virtual Work scatter(const void* send, void* recv, size_t count, DataType dtype, int root) = 0;
  // recv block p (count elements) = block `rank` of p's send.
  virtual Work alltoall(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // Like alltoall with per-peer counts and displacements (in elements). What rank a
  // sends to b must equal what b expects from a; this is checked on every rank, and a
  // mismatch fails the Work on every rank with InvalidArgumentError (naming both ranks
  // and counts where it was found). Over tcp each count travels just ahead of its data
  // and each rank's finding behind it (two latencies in all), so on a mismatch the recv
  // buffer's blocks are unspecified (nothing outside them is written; the communicator
  // stays usable).
  virtual Work alltoallv(const void* send, std::span<const size_t> send_counts,
                         std::span<const size_t> send_displs, void* recv,
                         std::span<const size_t> recv_counts,
                         std::span<const size_t> recv_displs, DataType dtype) = 0;
  // Completes on every rank once every rank has issued it.
  virtual Work barrier() = 0;
  // Point to point. Messages between two ranks arrive in the order they were sent. A
  // recv takes the first message from `peer` sent with its `tag` (any int), which must
  // have its count and dtype; messages from that peer with other tags that arrived
  // first are held by the communicator for their own receives (at most
  // kMaxHeldBytes at a time: a PeerError beyond). Operations run in issue order, and a
  // send may wait for its recv (once the transport's buffer between the two is full: a
  // shared-memory ring or the sockets), so order exchanges that cannot deadlock: even
  // ranks send first, odd ranks receive first. Work::source() of a recv is its peer.
  static constexpr size_t kMaxHeldBytes = size_t{1} << 30;
  virtual Work send(const void* buf, size_t count, DataType dtype, int peer, int tag = 0) = 0;
  virtual Work recv(void* buf, size_t count, DataType dtype, int peer, int tag = 0) = 0;
  // Receives the first message sent with `tag` to this rank by any of `sources` (empty:
  // every other rank): one held already (the oldest), else the first to arrive.
  // Work::source() names its sender. With a `claim` shared by receives on other
  // communicators, the receive that finds a message first takes it (see RecvClaim).
  virtual Work recv_any(void* buf, size_t count, DataType dtype, int tag,
                        std::vector<int> sources = {},
                        std::shared_ptr<RecvClaim> claim = nullptr) = 0;

  // Collective: ranks with the same `color` form a new communicator, ordered by `key`
  // then by rank in this one. A negative color returns nullptr (the rank takes part
  // in the exchange but joins no group).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Breaks the communicator: the running operation and every queued one fail with
  // AbortedError, peers are told and their operations fail too. Idempotent.
  virtual void abort(const std::string& reason) = 0;
  virtual bool is_aborted() const = 0;

  // The algorithm an operation of this kind and size would use now. `bytes` is what the
  // choice looks at: allreduce, broadcast, reduce: count * element size; allgather,
  // reduce_scatter, alltoall: the whole result (size * count elements); gather,
  // scatter: one rank's block; the others ignore it.
  virtual Algorithm algorithm_for(Collective collective, size_t bytes) const = 0;
  // The same by collective_name() ("allreduce", ...); InvalidArgumentError naming the
  // valid names for any other string.
  Algorithm algorithm_for(std::string_view collective, size_t bytes) const;
};

}  // namespace chorus
