// chorus-bench: the collective benchmark, shaped like nccl-tests.
//
// Each rank runs the chosen collective over sizes from --minbytes to --maxbytes; rank 0
// prints one row per size (size, count, type, redop, algorithm, time, algbw, busbw,
// wrong elements), as a table or, with --json, as JSON lines. Ranks come from the
// environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or --np N starts N local
// ranks of this same program on 127.0.0.1 and supervises them; --nodes K then makes
// them K simulated nodes (CHORUS_NODE_ID), for the hierarchical algorithms. --np ranks
// are bound to CPUs as chorusrun binds its workers (--cpu-bind, run/cpu_binding.h), by
// their place among all the ranks on this machine, simulated nodes or not.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "chorus/chorus.h"
#include "comm/common/socket.h"
#include "run/cpu_binding.h"

namespace {

using chorus::Algorithm;
using chorus::Communicator;
using chorus::DataType;
using chorus::ReduceOp;

constexpr int kRoot = 0;

enum class Collective { kAllreduce, kBroadcast, kReduce, kAllgather, kAllgatherv,
                        kReduceScatter, kAlltoall, kAlltoallv, kGather, kScatter, kSendRecv };

struct CollectiveInfo {
  Collective collective;
  bool reduces;  // takes a ReduceOp
  bool blocked;  // a row's count is split into one block per rank
};

const std::map<std::string, CollectiveInfo> kCollectives = {
    {"allreduce", {Collective::kAllreduce, true, false}},
    {"broadcast", {Collective::kBroadcast, false, false}},
    {"reduce", {Collective::kReduce, true, false}},
    {"allgather", {Collective::kAllgather, false, true}},
    // allgatherv with every count equal: allgather's data through the "v" path.
    {"allgatherv", {Collective::kAllgatherv, false, true}},
    {"reduce_scatter", {Collective::kReduceScatter, true, true}},
    {"alltoall", {Collective::kAlltoall, false, true}},
    // alltoallv with every count equal: alltoall's data through the "v" path, which
    // first checks every pair's counts.
    {"alltoallv", {Collective::kAlltoallv, false, true}},
    {"gather", {Collective::kGather, false, true}},
    {"scatter", {Collective::kScatter, false, true}},
    // Point to point: every rank sends the row's bytes to the next rank and receives as
    // many from the previous one (even ranks send first, odd ranks receive first).
    {"sendrecv", {Collective::kSendRecv, false, false}},
};

const std::map<std::string, Algorithm> kAlgorithms = {
    {"auto", Algorithm::kAuto}, {"ring", Algorithm::kRing},
    {"rd", Algorithm::kRecursiveDoubling}, {"hd", Algorithm::kHalvingDoubling},
    {"shm", Algorithm::kShmDirect}, {"hier", Algorithm::kHierarchical}};

struct Options {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  uint64_t step_factor = 2;
  std::string collective = "allreduce";
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  std::optional<Algorithm> algorithm;  // unset: CHORUS_ALGO or auto
  int np = 0;                          // 0: ranks come from the environment
  int nodes = 0;                       // --np ranks as this many simulated nodes; 0: none
  int timeout_s = 900;                 // deadline of the whole --np run
  chorus::run::CpuBind cpu_bind = chorus::run::CpuBind::kAuto;  // of --np ranks
  bool json = false;
};

// ---------------------------------------------------------------- command line

// A CLI11 check that accepts what `parse` accepts (chorus::parse_dtype/parse_op).
template <class Parse>
CLI::Validator parsed_by(const char* what, Parse parse) {
  return CLI::Validator(
      [=](std::string& text) {
        return parse(text) ? std::string() : "unknown " + std::string(what) + " '" + text + "'";
      },
      what);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "chorus-bench: %s\n", message.c_str());
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  std::string redop = "sum", dtype = "f32", algo;
  int check = 1;
  CLI::App app{"chorus collective benchmark (nccl-tests style)", "chorus-bench"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size, bytes (K/M/G suffixes)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size, bytes (default 256M)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplier")->check(CLI::Range(2, 1 << 20));
  app.add_option("-o,--op", o.collective, "collective")->check(CLI::IsMember(kCollectives));
  app.add_option("-r,--redop", redop, "sum, prod, min, max, avg")
      ->check(parsed_by("REDOP", chorus::parse_op));
  app.add_option("-d,--datatype", dtype, "f32, f64, f16, bf16, i8, u8, i32, i64")
      ->check(parsed_by("TYPE", chorus::parse_dtype));
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1 << 30));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations")->check(CLI::Range(0, 1 << 30));
  app.add_option("-c,--check", check, "verify results (0/1)")->check(CLI::Range(0, 1));
  app.add_option("-a,--algo", algo, "auto, ring, rd, hd, shm, hier (default: CHORUS_ALGO)")
      ->check(CLI::IsMember(kAlgorithms));
  app.add_option("--np", o.np, "start N local ranks on 127.0.0.1")->check(CLI::Range(1, 1024));
  app.add_option("--nodes", o.nodes,
                 "with --np: split the ranks into K simulated nodes of consecutive ranks "
                 "(CHORUS_NODE_ID=node<i>)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--timeout", o.timeout_s, "deadline of an --np run, seconds (default 900)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  std::string cpu_bind = "auto";
  app.add_option("--cpu-bind", cpu_bind,
                 "with --np: bind the ranks to CPUs as chorusrun does: auto (only when they "
                 "outnumber the CPUs), share, none")
      ->check(parsed_by("POLICY", chorus::run::parse_cpu_bind));
  app.add_flag("--json", o.json, "print rows as JSON lines");
  app.set_version_flag("--version", std::string("chorus-bench ") + CHORUS_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  if (o.min_bytes == 0) usage_error("--minbytes must be at least 1");
  if (o.min_bytes > o.max_bytes) usage_error("--minbytes must not exceed --maxbytes");
  if (o.nodes > 0 && o.np == 0) usage_error("--nodes needs --np");
  if (o.nodes > o.np) usage_error("--nodes must not exceed --np");
  o.op = *chorus::parse_op(redop);
  o.dtype = *chorus::parse_dtype(dtype);
  o.check = check == 1;
  o.cpu_bind = *chorus::run::parse_cpu_bind(cpu_bind);
  if (!algo.empty()) o.algorithm = kAlgorithms.at(algo);
  return o;
}

// ---------------------------------------------------------------- element values

// Element access through the library's own f16/bf16 conversions; integers wrap.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

template <class T> T from_double(double v) {
  if constexpr (std::is_same_v<T, Half>) return {chorus::float_to_half(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, BFloat16>) return {chorus::float_to_bfloat16(static_cast<float>(v))};
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<int64_t>(v));
  else return static_cast<T>(v);
}

template <class T> double to_double(T v) {
  if constexpr (std::is_same_v<T, Half>) return chorus::half_to_float(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>) return chorus::bfloat16_to_float(v.bits);
  else return static_cast<double>(v);
}

// Calls f(T{}) with T the C++ type of `dtype`.
template <class F> decltype(auto) with_element_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: return f(float{});
    case DataType::kFloat64: return f(double{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kBFloat16: return f(BFloat16{});
    case DataType::kInt8: return f(int8_t{});
    case DataType::kUInt8: return f(uint8_t{});
    case DataType::kInt32: return f(int32_t{});
    case DataType::kInt64: return f(int64_t{});
  }
  throw std::logic_error("unknown DataType");
}

// Relative tolerance of a float result: a few roundings of the element type per rank.
double tolerance(DataType dtype, int ranks) {
  switch (dtype) {
    case DataType::kFloat32: return 1e-6 * ranks;
    case DataType::kFloat64: return 1e-14 * ranks;
    case DataType::kFloat16: return 1e-3 * ranks;
    case DataType::kBFloat16: return 8e-3 * ranks;
    default: return 0;  // integers are exact (modulo wrap-around)
  }
}

// What every rank sends and what each must receive, in closed form. The values stay
// small integers (exact in every type for worlds of a dozen ranks; integer sums wrap
// like the library's). Reductions: rank r sends r+1 + i%3 at index i (prod: 2 on
// the one rank with (i+r)%size == 0, else 1, so every product is 2). Data movement:
// rank r sends (7r + i) % 101, which tells the source rank and index apart.
struct Pattern {
  const CollectiveInfo& info;
  ReduceOp op;
  int rank, size;
  size_t block;  // elements per rank block (blocked collectives)

  // Element i of rank `from`'s send buffer.
  double input(int from, size_t i) const {
    if (!info.reduces) return static_cast<double>((7 * static_cast<size_t>(from) + i) % 101);
    if (op == ReduceOp::kProd) return (i + from) % size == 0 ? 2 : 1;
    return from + 1 + static_cast<double>(i % 3);
  }

  // The reduction over all ranks of input(*, i), as T.
  template <class T> double reduced(size_t i) const {
    double k = static_cast<double>(i % 3), n = size;
    double sum = to_double(from_double<T>(n * (n + 1) / 2 + n * k));
    switch (op) {
      case ReduceOp::kSum: return sum;
      case ReduceOp::kProd: return 2;
      case ReduceOp::kMin: return 1 + k;
      case ReduceOp::kMax: return n + k;
      case ReduceOp::kAvg: return std::is_integral_v<T> ? std::trunc(sum / n) : sum / n;
    }
    return 0;
  }

  // The value element i of this rank's receive buffer must hold.
  template <class T> double expected(size_t i) const {
    switch (info.collective) {
      case Collective::kAllreduce:
      case Collective::kReduce: return reduced<T>(i);
      case Collective::kReduceScatter: return reduced<T>(rank * block + i);
      case Collective::kBroadcast: return input(kRoot, i);
      case Collective::kAllgather:
      case Collective::kAllgatherv:
      case Collective::kGather: return input(static_cast<int>(i / block), i % block);
      case Collective::kScatter: return input(kRoot, rank * block + i);
      case Collective::kSendRecv: return input((rank + size - 1) % size, i);
      case Collective::kAlltoall:
      case Collective::kAlltoallv: return input(static_cast<int>(i / block), rank * block + i % block);
    }
    return 0;
  }
};

// data[i] = value_of(i) for i < count, as elements of `dtype`.
template <class ValueOf>
void fill(void* data, DataType dtype, size_t count, ValueOf value_of) {
  with_element_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    for (size_t i = 0; i < count; ++i) p[i] = from_double<T>(value_of(i));
  });
}

int64_t count_wrong(const void* data, DataType dtype, size_t count, const Pattern& pattern) {
  double tol = tolerance(dtype, pattern.size);
  return with_element_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(data);
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      double want = to_double(from_double<T>(pattern.expected<T>(i)));
      wrong += std::fabs(to_double(p[i]) - want) > tol * std::max(1.0, std::fabs(want));
    }
    return wrong;
  });
}

// ---------------------------------------------------------------- one size

struct Bench {
  Communicator& comm;
  const Options& options;
  const CollectiveInfo& info;
  std::vector<std::byte> send, recv;
};

// Element counts of one row: `count` as printed (nccl-tests: the whole buffer of the
// blocked collectives), `block` per rank, and the lengths of this rank's buffers.
struct Shape {
  size_t count, block, send_count, recv_count;
};

Shape shape_of(const CollectiveInfo& info, size_t elements, int rank, int size) {
  if (!info.blocked) {
    bool root_only = info.collective == Collective::kReduce && rank != kRoot;
    return {elements, elements, elements, root_only ? 0 : elements};
  }
  size_t block = elements / size, all = block * size;
  switch (info.collective) {
    case Collective::kAllgather:
    case Collective::kAllgatherv: return {all, block, block, all};
    case Collective::kGather: return {all, block, block, rank == kRoot ? all : 0};
    case Collective::kScatter: return {all, block, rank == kRoot ? all : 0, block};
    case Collective::kReduceScatter: return {all, block, all, block};
    default: return {all, block, all, all};  // alltoall
  }
}

chorus::Work issue(Bench& b, const Shape& s) {
  Communicator& c = b.comm;
  const void* in = b.send.data();
  void* out = b.recv.data();
  DataType t = b.options.dtype;
  ReduceOp op = b.options.op;
  switch (b.info.collective) {
    case Collective::kAllreduce: return c.allreduce(in, out, s.count, t, op);
    case Collective::kBroadcast: return c.broadcast(in, out, s.count, t, kRoot);
    case Collective::kReduce: return c.reduce(in, out, s.count, t, op, kRoot);
    case Collective::kAllgather: return c.allgather(in, out, s.block, t);
    case Collective::kAllgatherv: {
      const std::vector<size_t> counts(static_cast<size_t>(c.size()), s.block);
      return c.allgatherv(in, s.block, out, counts, {}, t);
    }
    case Collective::kReduceScatter: return c.reduce_scatter(in, out, s.block, t, op);
    case Collective::kAlltoall: return c.alltoall(in, out, s.block, t);
    case Collective::kAlltoallv: {
      const std::vector<size_t> counts(static_cast<size_t>(c.size()), s.block);
      return c.alltoallv(in, counts, {}, out, counts, {}, t);
    }
    case Collective::kGather: return c.gather(in, out, s.block, t, kRoot);
    case Collective::kScatter: return c.scatter(in, out, s.block, t, kRoot);
    case Collective::kSendRecv: {
      // Ops run in issue order: the second one's Work completes after both.
      const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
      if (c.rank() % 2 == 0) {
        c.send(in, s.count, t, next);
        return c.recv(out, s.count, t, prev);
      }
      c.recv(out, s.count, t, prev);
      return c.send(in, s.count, t, next);
    }
  }
  throw std::logic_error("unknown collective");
}

// Average microseconds per op over `iters` back-to-back ops, the maximum over ranks.
double time_op(Bench& b, const Shape& s) {
  for (int i = 0; i < b.options.warmup; ++i) issue(b, s).wait();
  b.comm.barrier().wait();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < b.options.iters; ++i) issue(b, s).wait();
  std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  double us = elapsed.count() / b.options.iters;
  b.comm.allreduce(&us, 1, DataType::kFloat64, ReduceOp::kMax).wait();
  return us;
}

// One more op on a poisoned receive buffer; wrong elements summed over ranks.
int64_t check_op(Bench& b, const Shape& s) {
  Pattern pattern{b.info, b.options.op, b.comm.rank(), b.comm.size(), s.block};
  fill(b.recv.data(), b.options.dtype, s.recv_count, [](size_t) { return -3.0; });
  issue(b, s).wait();
  int64_t wrong = count_wrong(b.recv.data(), b.options.dtype, s.recv_count, pattern);
  b.comm.allreduce(&wrong, 1, DataType::kInt64, ReduceOp::kSum).wait();
  return wrong;
}

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::kAllreduce: return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllgather:
    case Collective::kAllgatherv:
    case Collective::kAlltoall:
    case Collective::kAlltoallv: return static_cast<double>(n - 1) / n;
    default: return 1;
  }
}

// ---------------------------------------------------------------- output

struct Row {
  size_t bytes, count;
  const char* algo;
  double time_us, algbw, busbw;
  std::optional<int64_t> wrong;
};

void print_header(const Bench& b) {
  const Options& o = b.options;
  std::printf("# chorus-bench %s: %d ranks on %d node(s), iters %d, warmup %d, check %d\n",
              o.collective.c_str(), b.comm.size(), b.comm.topology().nodes, o.iters, o.warmup,
              o.check ? 1 : 0);
  std::printf("#%13s %12s %6s %6s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
              "redop", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

void print_row(const Bench& b, const Row& r) {
  const Options& o = b.options;
  const char* redop = b.info.reduces ? chorus::op_name(o.op) : "none";
  if (o.json) {
    nlohmann::ordered_json j = {{"collective", o.collective}, {"ranks", b.comm.size()},
                        {"size", r.bytes}, {"count", r.count},
                        {"type", chorus::dtype_name(o.dtype)}, {"redop", redop},
                        {"algo", r.algo}, {"time_us", r.time_us}, {"algbw", r.algbw},
                        {"busbw", r.busbw}, {"wrong", nullptr}};
    if (r.wrong) j["wrong"] = *r.wrong;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string wrong = r.wrong ? std::to_string(*r.wrong) : "N/A";
    std::printf("%14zu %12zu %6s %6s %6s %12.2f %12.3f %12.3f %8s\n", r.bytes, r.count,
                chorus::dtype_name(o.dtype), redop, r.algo, r.time_us, r.algbw, r.busbw,
                wrong.c_str());
  }
  std::fflush(stdout);
}

Row run_size(Bench& b, uint64_t bytes) {
  size_t elem = chorus::dtype_size(b.options.dtype);
  Shape s = shape_of(b.info, bytes / elem, b.comm.rank(), b.comm.size());
  Row r{s.count * elem, s.count, nullptr, 0, 0, 0, std::nullopt};
  const std::string& c = b.options.collective;
  r.algo = chorus::algorithm_name(b.comm.algorithm_for(c == "sendrecv" ? "send" : c.c_str(), r.bytes));
  r.time_us = time_op(b, s);
  r.algbw = r.time_us > 0 ? r.bytes / (r.time_us * 1e3) : 0;  // GB/s
  r.busbw = r.algbw * bus_factor(b.info.collective, b.comm.size());
  if (b.options.check) r.wrong = check_op(b, s);
  return r;
}

int run_rank(const Options& o) {
  chorus::CommOptions comm_options = chorus::CommOptions::from_env();
  if (o.algorithm) comm_options.algorithm = *o.algorithm;
  std::shared_ptr<Communicator> comm = Communicator::from_env(comm_options);
  size_t max_count = o.max_bytes / chorus::dtype_size(o.dtype);
  Bench b{*comm, o, kCollectives.at(o.collective), {}, {}};
  b.send.resize(max_count * chorus::dtype_size(o.dtype));
  b.recv.resize(b.send.size());
  Pattern pattern{b.info, o.op, comm->rank(), comm->size(), 0};
  fill(b.send.data(), o.dtype, max_count, [&](size_t i) { return pattern.input(pattern.rank, i); });
  if (comm->rank() == 0 && !o.json) print_header(b);
  int64_t wrong = 0;
  for (uint64_t bytes = o.min_bytes;; bytes *= o.step_factor) {
    Row r = run_size(b, bytes);
    wrong += r.wrong.value_or(0);
    if (comm->rank() == 0) print_row(b, r);
    if (bytes > o.max_bytes / o.step_factor) break;
  }
  comm->barrier().wait();
  if (wrong != 0 && comm->rank() == 0)
    std::fprintf(stderr, "chorus-bench: %lld wrong elements\n", static_cast<long long>(wrong));
  return wrong == 0 ? 0 : 1;
}

// ---------------------------------------------------------------- --np launcher

// argv without the launcher's options ("--np N", "--nodes K", or with '='), for the
// children.
std::vector<std::string> child_args(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--np" || a == "--nodes") ++i;
    else if (a.rfind("--np=", 0) != 0 && a.rfind("--nodes=", 0) != 0) args.push_back(a);
  }
  return args;
}

// Where rank `rank` of `size` runs: its node and its place there. Without --nodes every
// rank shares this machine's node; with K nodes they are K blocks of consecutive ranks
// (sizes differ by at most one when K does not divide N).
struct Placement {
  int node = -1;  // -1: no simulated node
  int local_rank = 0, local_size = 1;
};

Placement place(int rank, int size, int nodes) {
  if (nodes == 0) return {-1, rank, size};
  // Node n holds ranks [first(n), first(n + 1)): node_of(r) = floor(r * nodes / size).
  auto first = [&](int n) { return (n * size + nodes - 1) / nodes; };
  int node = rank * nodes / size;
  return {node, rank - first(node), first(node + 1) - first(node)};
}

// Forks and execs this program as rank `rank`. The launcher has no other thread, so
// the child may call setenv() between fork and exec.
pid_t spawn_rank(const std::vector<std::string>& args, int rank, int size, int nodes,
                 uint16_t port, const std::vector<int>& cpus) {
  const Placement where = place(rank, size, nodes);
  const chorus::run::CpuMask mask(cpus);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw chorus::SystemError(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // no rank outlives the launcher
  if (getppid() != parent) _exit(1);
  mask.apply();
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(where.local_rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(where.local_size).c_str(), 1);
  if (where.node >= 0) setenv("CHORUS_NODE_ID", ("node" + std::to_string(where.node)).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  unsetenv("CHORUS_STORE_HOSTED");  // rank 0 hosts the store itself, on MASTER_PORT
  unsetenv("CHORUS_STORE_ADDR");
  unsetenv("CHORUS_STORE_PORT");
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "chorus-bench: exec /proc/self/exe: %s\n", std::strerror(errno));
  _exit(127);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
}

void kill_running(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids)
    if (pid > 0) kill(pid, SIGKILL);
}

// Reaps every rank. The first failure or the deadline kills the rest. Returns the
// program's exit status.
int supervise(std::vector<pid_t> pids, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  size_t running = pids.size();
  bool failed = false;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) throw chorus::SystemError(std::string("waitpid: ") + std::strerror(errno));
    if (pid == 0) {
      if (!failed && std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "chorus-bench: timed out after %llds, stopping all ranks\n",
                     static_cast<long long>(timeout.count()));
        kill_running(pids);
        failed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    *it = -1;
    --running;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !failed) {
      std::fprintf(stderr, "chorus-bench: rank %d %s, stopping the other ranks\n",
                   static_cast<int>(it - pids.begin()), describe_status(status).c_str());
      kill_running(pids);
      failed = true;
    }
  }
  return failed ? 1 : 0;
}

// A port that nobody listens on right now (rank 0 binds it moments later).
uint16_t free_loopback_port() {
  chorus::net::Fd listener = chorus::net::listen_on("127.0.0.1", 0);
  return chorus::net::local_address(listener.get()).port();
}

int launch_local_ranks(const Options& o, int argc, char** argv) {
  uint16_t port = free_loopback_port();
  std::vector<std::string> args = child_args(argc, argv);
  std::vector<pid_t> pids;
  const std::vector<int> allowed = chorus::run::allowed_cpus();
  for (int rank = 0; rank < o.np; ++rank) {
    try {
      pids.push_back(spawn_rank(args, rank, o.np, o.nodes, port,
                                chorus::run::cpus_for(o.cpu_bind, rank, o.np, allowed)));
    } catch (...) {
      kill_running(pids);
      throw;
    }
  }
  return supervise(std::move(pids), std::chrono::seconds(o.timeout_s));
}

}  // namespace

int main(int argc, char** argv) {
  // Ranks run through /proc/self/exe (launch_local_ranks()), which the kernel names "exe".
  prctl(PR_SET_NAME, "chorus-bench");
  Options options = parse_options(argc, argv);
  try {
    if (options.np > 0) return launch_local_ranks(options, argc, argv);
    return run_rank(options);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "chorus-bench: rank %s: %s\n", rank ? rank : "0", e.what());
    return 1;
  }
}
