// Every environment variable chorus_comm reads, each through one accessor with one
// documented default (docs/environment.md lists them). A bad value throws ConfigError
// naming the variable and the value.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace chorus::settings {

// CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT (seconds): the deadline of each operation
// that the operator sets, overriding any a program passes (CommOptions::from_env(
// timeout)); nullopt when neither is set. Durations accept a plain number of seconds or
// a suffix: ms, s, m, h.
struct TimeoutOverride {
  std::string variable;  // the one that is set
  std::string value;     // its text
  std::chrono::milliseconds timeout;
};
std::optional<TimeoutOverride> op_timeout_override();
// op_timeout_override()'s timeout, default 30 min.
std::chrono::milliseconds op_timeout();
// CHORUS_CONNECT_TIMEOUT, else HCCL_CONNECT_TIMEOUT (seconds), default 120 s.
std::chrono::milliseconds connect_timeout();
// CHORUS_JOB_TOKEN; empty when unset or set to "" (both mean: no token of your own;
// chorusrun then picks one, see run/supervisor.cc).
std::string job_token();
// The allow-list of peer addresses (comm/common/allowlist.h): CHORUS_WHITELIST_FILE,
// else HCCL_WHITELIST_FILE unless HCCL_WHITELIST_DISABLE=1. nullopt when every address
// is allowed. Throws ConfigError for HCCL_WHITELIST_DISABLE other than 0 or 1, and for
// HCCL_WHITELIST_DISABLE=0 (the list turned on, as in HCCL) with no file named.
struct AllowListFile {
  std::string path;
  std::string variable;  // the variable that named it
};
std::optional<AllowListFile> allowlist_file();
// CHORUS_ALGO: auto | ring | rd (recursive doubling) | hd (halving-doubling) | shm
// (direct shared memory, the ranks of one node) | hier (hierarchical) | tree (binomial
// tree: broadcast, reduce), default auto; CommOptions::from_env() parses it by the
// algorithm table's names (also the long names recursive_doubling, halving_doubling,
// direct, hierarchical, binomial_tree) and throws ConfigError for any other.
std::string algorithm();
// CHORUS_IF_IP, else HCCL_IF_IP: the address to listen on. Empty when unset.
std::string if_ip();
// CHORUS_SOCKET_IFNAME, else HCCL_SOCKET_IFNAME: interface patterns. Empty when unset.
std::string socket_ifname();
// MASTER_ADDR, default 127.0.0.1.
std::string master_addr();
// MASTER_PORT, default 29500.
uint16_t master_port();
// Where the rendezvous store is: CHORUS_STORE_ADDR, default master_addr(); and
// CHORUS_STORE_PORT (1..65535), default master_port(). A launcher that hosts the store
// (chorusrun) sets them, so that MASTER_ADDR/MASTER_PORT stay free for a PyTorch
// program's own TCPStore.
std::string store_addr();
uint16_t store_port();
// RANK and WORLD_SIZE; both unset means rank 0 of 1. One without the other is an error.
// WORLD_SIZE is at most 2^20; what a job can reach is less, bounded by each rank's
// file descriptors (two per peer, see Communicator::create).
int rank();
int world_size();
// CHORUS_STORE_HOSTED=1: a launcher hosts the store, rank 0 must not start one.
bool store_hosted();
// CHORUS_RESTART_COUNT: how often a launcher restarted the job (0 when unset). A
// restarted job keeps its store, so communicators of each attempt use their own keys.
int restart_count();
// CHORUS_NODE_ID: overrides the node identity (hostname and boot id) that decides
// which ranks share a node and so shared memory; tests simulate nodes with it. Empty
// when unset.
std::string node_id();
// CHORUS_TRANSPORT: auto (shared memory between ranks of a node, tcp across nodes) |
// tcp (tcp everywhere) | shm (like auto, but an error when shared memory cannot be
// set up). Default auto.
std::string transport();
// CHORUS_COST_MODEL: parameters of the algorithm cost model (cost_model.h), e.g.
// "tcp_alpha_us=20,tcp_gbps=10"; empty when unset.
std::string cost_model();

// CHORUS_SEGMENT_BYTES: pipelining unit of the ring and chain algorithms, bytes, with
// an optional K, M or G suffix (powers of 1024); 4 KiB to 1 GiB. Unset: nullopt, and
// CommOptions keeps its default (kDefaultSegmentBytes, chorus/communicator.h).
std::optional<int64_t> segment_bytes();
// CHORUS_SHM_CMA: 1 (default) lets the ranks of a node of two read each other's
// buffers with process_vm_readv where the kernel allows it; `all` also in larger
// nodes; 0 keeps every byte in the segment. Returns 0, 1 or 2 (all).
int shm_cma();
// CHORUS_SHM_DIRECT: 1 (default) or 0; collectives on node-shared buffers take the
// direct path (include/chorus/shared_memory.h).
bool shm_direct();
// CHORUS_SHM_INLINE: 1 (default) or 0; ConfigError otherwise.
bool shm_inline();
// CHORUS_DEBUG: OFF (default) | INFO | DETAIL, any case, as TORCH_DISTRIBUTED_DEBUG:
// INFO makes info the default log level (each communicator then says how it was set
// up); DETAIL does too, and compares every collective's fingerprint across ranks before
// it runs.
enum class DebugMode { kOff, kInfo, kDetail };
DebugMode debug_mode();
bool debug_detail();  // debug_mode() == kDetail
// CHORUS_TRACE_BUFFER_SIZE: operations each communicator's flight recorder keeps
// (default 256, 0 turns it off). CHORUS_TRACE_DIR: where it writes them on a timeout or
// abort (empty: the flight recorder's default directory, flight_recorder.h).
int64_t trace_buffer_size();
std::string trace_dir();
// CHORUS_LOG_LEVEL: error | warn | info | debug; default warn, or info when CHORUS_DEBUG
// is INFO or DETAIL.
int log_level();
// CHORUS_REDUCE_ISA, default auto: the instruction set of the reduction kernels, as
// set. Its names are checked by parse_reduce_isa (comm/reduce/reduce.h, the layer that
// knows them): CommOptions::from_env() and Communicator::create() do so, so that a bad
// value fails (ConfigError) where the communicator is made, not on a progress thread; a
// set ISA the CPU lacks is logged once by reduce.cc and replaced by the best one it has.
std::string reduce_isa();

// Helpers shared by the accessors, exposed for tests.
std::chrono::milliseconds parse_duration(const std::string& name, const std::string& value,
                                         std::chrono::milliseconds unit);
int64_t parse_int(const std::string& name, const std::string& value, int64_t min, int64_t max);
// The value of `name`; nullopt when unset or set to the empty string (for the choice
// variables, CHORUS_DEBUG= reads as unset).
std::optional<std::string> get_env(const char* name);
// Like get_env(), but set-and-empty throws ConfigError naming the variable: for the
// numbers and addresses (MASTER_PORT="" is a mistake, not a request for 29500).
std::optional<std::string> required_value(const char* name);

}  // namespace chorus::settings
