// The collective sweep: every collective x dtype x op x count x in-place/out-of-place x
// root x algorithm, on world sizes 1..8, with closed-form expected values
// (tests/util/expected.h). One TEST_P instance per collective and world size, so that
// ctest runs them as separate entries (in parallel with -j).
//
// Cost control (2 cores, up to 8 rank threads): one group of communicators per
// algorithm and test, reused across all of that test's cases; the large count
// (2^20 + 3 elements, not divisible by any world size > 1) runs every dtype x op of
// allreduce, but only f32, bf16 and i8 for the other collectives; with a forced
// algorithm the large count runs only a few allreduce cases, f32 reduce_scatter in sum
// and avg, and f32 allgather (the collectives the algorithms are defined for); the
// forced algorithms run every collective on the small counts, where a wrong dispatch
// shows just as well.
// CHORUS_SWEEP=quick (scripts/sanitize.sh, where everything runs 2-15x slower) makes the
// large count 2^18 + 3 and runs it in f32 and sum only; the small counts still run
// every dtype x op.
//
// Every case checks: the result against the closed form, that a send buffer that is
// not also the result buffer is unchanged, that memory the collective must not write
// (gaps between allgatherv/alltoallv blocks, reduce's recv on non-roots) still holds
// the sentinel, and for allreduce that every rank got bitwise identical results.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/expected.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using test::check_move;
using test::check_reduce_input;
using test::check_sentinel;
using test::fill_move;
using test::fill_reduce_input;
using test::ReduceExpectation;

// CHORUS_SWEEP=quick: a smaller large count, in f32 and (reductions) sum only.
bool quick_sweep() {
  const char* s = std::getenv("CHORUS_SWEEP");
  return s != nullptr && std::strcmp(s, "quick") == 0;
}

// Not divisible by any world size > 1; still several shared-memory chunks when quick.
const size_t kBig = quick_sweep() ? (size_t{1} << 18) + 3 : (size_t{1} << 20) + 3;
constexpr size_t kSmallCounts[] = {0, 1, 7, 1000};
// Forced bruck runs the allgather and the alltoall (its collectives); the others keep their choice over tcp.
constexpr Algorithm kAlgorithms[] = {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                     Algorithm::kHalvingDoubling, Algorithm::kBruck};
constexpr DataType kBigSubset[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kInt8};
// Cases after which a test stops (a systematic bug would otherwise print thousands).
constexpr int kMaxFailedCases = 10;

// ----- cases -----

struct Case {
  const char* collective = "";
  Algorithm algorithm = Algorithm::kAuto;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  bool in_place = false;
  int root = 0;
  int variant = 0;  // allgatherv: 0 packed (empty displs), 1 explicit displs with gaps
  bool reducing = false, rooted = false;

  std::string name() const {
    std::ostringstream s;
    s << collective << " algorithm=" << algorithm_name(algorithm) << " dtype=" << dtype_name(dtype);
    if (reducing) s << " op=" << op_name(op);
    s << " count=" << count << (in_place ? " in-place" : " out-of-place");
    if (rooted) s << " root=" << root;
    if (variant != 0) s << " variant=" << variant;
    return s.str();
  }
};

// What one rank saw in one case.
struct RankResult {
  std::string errors;
  uint64_t checksum = 0;
  bool has_checksum = false;

  void expect(const char* what, const std::string& problem) {
    if (!problem.empty()) errors += std::string(what) + ": " + problem + "\n";
  }
};

using CaseFn = std::function<void(Communicator&, const Case&, RankResult&)>;

// Whether the sweep runs `collective` with `algorithm` forced. Bruck's are allgather's
// and alltoall's only: forced on another collective it leaves the choice automatic over
// tcp, which the groups of ring, rd and hd already run.
bool swept(std::string_view collective, Algorithm algorithm) {
  return algorithm != Algorithm::kBruck || collective == "allgather" || collective == "alltoall";
}

std::vector<int> roots_for(int size) {
  return size == 1 ? std::vector<int>{0} : std::vector<int>{0, size - 1};
}

// The cases of one collective. `big_dtypes` empty: the large count is not run.
std::vector<Case> make_cases(const char* collective, int size, bool reducing, bool rooted,
                             bool has_in_place, bool algorithm_specific,
                             const std::vector<DataType>& big_dtypes, int variants = 1) {
  std::vector<Case> cases;
  auto add = [&](Algorithm algorithm, DataType dtype, size_t count) {
    std::vector<ReduceOp> ops{ReduceOp::kSum};
    if (reducing && count == kBig && algorithm != Algorithm::kAuto) {
      // A forced algorithm on the large count: what differs from the automatic choice
      // is how the data moves, not the reduction kernels (every op runs on the large
      // count with kAuto); avg also divides once the sum is complete.
      if (!quick_sweep()) ops.push_back(ReduceOp::kAvg);
    } else if (reducing && !(quick_sweep() && count == kBig)) {
      ops.assign(std::begin(kAllReduceOps), std::end(kAllReduceOps));
    }
    for (ReduceOp op : ops) {
      for (int root : rooted ? roots_for(size) : std::vector<int>{0}) {
        for (bool in_place : has_in_place ? std::vector<bool>{false, true}
                                          : std::vector<bool>{false}) {
          for (int variant = 0; variant < variants; ++variant) {
            Case k;
            k.collective = collective;
            k.algorithm = algorithm;
            k.dtype = dtype;
            k.op = op;
            k.count = count;
            k.in_place = in_place;
            k.root = root;
            k.variant = variant;
            k.reducing = reducing;
            k.rooted = rooted;
            cases.push_back(k);
          }
        }
      }
    }
  };
  for (Algorithm algorithm : kAlgorithms) {
    if (!swept(collective, algorithm)) continue;
    for (size_t count : kSmallCounts) {
      for (DataType dtype : kAllDataTypes) add(algorithm, dtype, count);
    }
    if (algorithm == Algorithm::kAuto) {
      for (DataType dtype : big_dtypes) add(algorithm, dtype, kBig);
    } else if (algorithm_specific && !big_dtypes.empty()) {
      add(algorithm, big_dtypes.front(), kBig);  // f32: each algorithm on a large buffer
    }
  }
  return cases;
}

// ----- running -----

// Blocks of 1 MiB and more go back to this pool (by exact size, shared by the rank
// threads) instead of to the system. The large cases allocate up to 36 MiB per rank,
// and fresh pages for every rank of every case cost more in page faults than the
// collective itself (ReduceScatter/size8 took 21 s with fresh pages, 13.6 s with glibc
// told to keep the memory). Not under AddressSanitizer, which must see every buffer
// freed to catch a late write into it.
class BlockPool {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{2} << 30;

  static BlockPool& instance() {
    static BlockPool pool;
    return pool;
  }

  std::unique_ptr<uint64_t[]> take(size_t words) {
    if (pooled(words)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(words);
      if (it != free_.end()) {
        std::unique_ptr<uint64_t[]> block = std::move(it->second);
        free_.erase(it);
        cached_bytes_ -= words * 8;
        return block;
      }
    }
    return std::unique_ptr<uint64_t[]>(new uint64_t[words]);
  }

  void give(std::unique_ptr<uint64_t[]> block, size_t words) {
    if (!block || !pooled(words)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_bytes_ + words * 8 > kMaxCachedBytes) return;  // freed
    cached_bytes_ += words * 8;
    free_.emplace(words, std::move(block));
  }

 private:
  static bool pooled(size_t words) {
#if defined(__SANITIZE_ADDRESS__)
    return false;
#else
    return words * 8 >= kMinBytes;
#endif
  }

  std::mutex mu_;
  std::multimap<size_t, std::unique_ptr<uint64_t[]>> free_;
  size_t cached_bytes_ = 0;
};

// A byte buffer initialised to the sentinel; data() is null when empty, so that count-0
// cases pass null pointers (which the contract allows).
class Buffer {
 public:
  explicit Buffer(size_t bytes)
      : words_(BlockPool::instance().take((bytes + 7) / 8)), bytes_(bytes) {
    if (bytes_ != 0) std::memset(words_.get(), test::kSentinelByte, bytes_);
  }
  ~Buffer() { BlockPool::instance().give(std::move(words_), (bytes_ + 7) / 8); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return bytes_ == 0 ? nullptr : reinterpret_cast<uint8_t*>(words_.get()); }
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<uint64_t[]> words_;  // 8-byte aligned, not zeroed (the sentinel is)
  size_t bytes_;
};

// Over tcp, groups of 2 and of odd sizes cut ring chunks into 64 KiB segments instead
// of the default 2 MiB, so that the large counts run deep pipelines: many segments per
// chunk, receive slots waiting for the sends that forward them, chunks larger than the
// socket buffers. The other sizes keep the default.
CommOptions sweep_options(Algorithm algorithm, int size) {
  CommOptions options = test::test_options();
  options.algorithm = algorithm;
  options.timeout = std::chrono::seconds(60);
  if (size == 2 || size % 2 == 1) options.segment_bytes = 64 * 1024;
  return options;
}

// Runs every case on groups of `size` ranks (one group per algorithm; the cases of one
// algorithm back to back, test::run_case_batches) and reports each failure with the
// case's name and the rank.
void run_sweep(int size, const std::vector<Case>& cases, const CaseFn& fn,
               bool identical_results = false) {
  std::map<Algorithm, std::unique_ptr<test::RankGroup>> groups;
  std::vector<std::vector<RankResult>> results(cases.size(), std::vector<RankResult>(size));
  // CHORUS_SWEEP_VERBOSE=1 prints every case with rank 0's time in it (to find slow cases).
  const bool verbose = std::getenv("CHORUS_SWEEP_VERBOSE") != nullptr;
  std::vector<double> rank0_ms(cases.size(), 0.0);
  int failed_cases = test::run_case_batches(
      size, cases.size(),
      [&](size_t begin) {
        size_t end = begin;
        while (end < cases.size() && cases[end].algorithm == cases[begin].algorithm) ++end;
        return end;
      },
      [&](size_t begin, size_t end, std::vector<size_t>& at) {
        auto& group = groups[cases[begin].algorithm];
        if (!group) {
          group = std::make_unique<test::RankGroup>(size,
                                                    sweep_options(cases[begin].algorithm, size));
        }
        group->run(
            [&](Communicator& comm) {
              const int rank = comm.rank();
              for (size_t i = begin; i < end; ++i) {
                at[rank] = i;
                const auto start = std::chrono::steady_clock::now();
                fn(comm, cases[i], results[i][rank]);
                if (rank == 0) {
                  rank0_ms[i] = std::chrono::duration<double, std::milli>(
                                    std::chrono::steady_clock::now() - start)
                                    .count();
                }
              }
            },
            std::chrono::seconds(600));
      },
      [&](const std::vector<size_t>& at, const test::RankFailure& failure) {
        std::ostringstream where;
        for (int rank = 0; rank < size; ++rank) {
          where << "\n  rank " << rank << " was in: " << cases[at[rank]].name();
        }
        ADD_FAILURE() << "size=" << size << ": a rank threw" << where.str() << "\n"
                      << failure.what();
      },
      kMaxFailedCases);
  for (size_t i = 0; i < cases.size() && failed_cases < kMaxFailedCases; ++i) {
    const Case& k = cases[i];
    if (verbose) std::printf("%8.2f ms  size=%d %s\n", rank0_ms[i], size, k.name().c_str());
    bool failed = false;
    for (int rank = 0; rank < size; ++rank) {
      if (!results[i][rank].errors.empty()) {
        ADD_FAILURE() << "size=" << size << " " << k.name() << " rank " << rank << ":\n"
                      << results[i][rank].errors;
        failed = true;
      }
    }
    if (identical_results && !failed) {
      for (int rank = 1; rank < size; ++rank) {
        if (results[i][rank].has_checksum && results[i][0].has_checksum &&
            results[i][rank].checksum != results[i][0].checksum) {
          ADD_FAILURE() << "size=" << size << " " << k.name() << ": rank " << rank
                        << "'s result differs bitwise from rank 0's (checksum " << std::hex
                        << results[i][rank].checksum << " vs " << results[i][0].checksum << ")";
          failed = true;
        }
      }
    }
    if (failed) ++failed_cases;
  }
  if (failed_cases >= kMaxFailedCases) {
    ADD_FAILURE() << "stopping after " << failed_cases << " failed cases";
  }
}

uint8_t* element(uint8_t* base, size_t index, DataType dtype) {
  return base + index * dtype_size(dtype);
}

// ----- one function per collective, run on every rank -----

void allreduce_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, bytes = n * dtype_size(k.dtype);
  Buffer send(bytes), recv(k.in_place ? 0 : bytes);
  fill_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n);
  uint8_t* out = k.in_place ? send.data() : recv.data();
  Work work = c.allreduce(send.data(), out, n, k.dtype, k.op);
  work.wait();
  if (!work.is_completed() || work.error() != nullptr) {
    res.expect("work", "wait() returned but is_completed()/error() disagree");
  }
  res.expect("result", ReduceExpectation(k.dtype, k.op, c.size()).check(out, 0, n));
  if (!k.in_place) {
    res.expect("send buffer", check_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n));
  }
  res.checksum = test::checksum(out, bytes);
  res.has_checksum = true;
}

void broadcast_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, bytes = n * dtype_size(k.dtype);
  const bool is_root = c.rank() == k.root;
  Buffer send(bytes), recv(k.in_place ? 0 : bytes);
  if (is_root) fill_move(k.dtype, k.root, send.data(), 0, n);
  uint8_t* out = k.in_place ? send.data() : recv.data();
  c.broadcast(send.data(), out, n, k.dtype, k.root).wait();
  res.expect("result", check_move(k.dtype, k.root, out, 0, n));
  if (is_root && !k.in_place) {
    res.expect("root's send buffer", check_move(k.dtype, k.root, send.data(), 0, n));
  }
}

void reduce_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, bytes = n * dtype_size(k.dtype);
  const bool is_root = c.rank() == k.root;
  Buffer send(bytes), recv(k.in_place ? 0 : bytes);
  fill_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n);
  uint8_t* out = k.in_place ? send.data() : recv.data();
  c.reduce(send.data(), out, n, k.dtype, k.op, k.root).wait();
  if (is_root) {
    res.expect("result on root", ReduceExpectation(k.dtype, k.op, c.size()).check(out, 0, n));
  } else if (!k.in_place) {
    res.expect("recv on a non-root (must not be touched)", check_sentinel(out, bytes));
  }
  if (!k.in_place || !is_root) {
    res.expect("send buffer", check_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, n));
  }
}

void allgather_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), rank = c.rank();
  Buffer recv(size * n * dtype_size(k.dtype)), own(k.in_place ? 0 : n * dtype_size(k.dtype));
  uint8_t* send = k.in_place ? element(recv.data(), rank * n, k.dtype) : own.data();
  fill_move(k.dtype, c.rank(), send, 0, n);
  c.allgather(send, recv.data(), n, k.dtype).wait();
  for (size_t r = 0; r < size; ++r) {
    res.expect(("block of rank " + std::to_string(r)).c_str(),
               check_move(k.dtype, static_cast<int>(r), element(recv.data(), r * n, k.dtype), 0, n));
  }
  if (!k.in_place) res.expect("send buffer", check_move(k.dtype, c.rank(), send, 0, n));
}

// allgatherv block sizes: varied, some empty.
size_t allgatherv_count(size_t n, int rank) {
  if (n == 0) return 0;
  return rank % 3 == 1 ? 0 : n + static_cast<size_t>(rank);
}

void allgatherv_case(Communicator& c, const Case& k, RankResult& res) {
  const int size = c.size(), rank = c.rank();
  const size_t es = dtype_size(k.dtype);
  constexpr size_t kGap = 3;
  std::vector<size_t> counts(size), displs;
  for (int r = 0; r < size; ++r) counts[r] = allgatherv_count(k.count, r);
  std::vector<size_t> where(size);  // the block offsets the library must use
  size_t total = 0;
  if (k.variant == 0) {
    for (int r = 0; r < size; ++r) {
      where[r] = total;
      total += counts[r];
    }
  } else {
    // Blocks in reverse rank order with gaps before each: the gaps must stay untouched.
    for (int r = size - 1; r >= 0; --r) {
      total += kGap;
      where[r] = total;
      total += counts[r];
    }
    displs = where;
  }
  Buffer recv(total * es), own(k.in_place ? 0 : counts[rank] * es);
  uint8_t* send = k.in_place ? element(recv.data(), where[rank], k.dtype) : own.data();
  fill_move(k.dtype, rank, send, 0, counts[rank]);
  c.allgatherv(send, counts[rank], recv.data(), counts, displs, k.dtype).wait();
  for (int r = 0; r < size; ++r) {
    res.expect(("block of rank " + std::to_string(r)).c_str(),
               check_move(k.dtype, r, element(recv.data(), where[r], k.dtype), 0, counts[r]));
    if (k.variant == 1) {
      res.expect("gap before a block",
                 check_sentinel(element(recv.data(), where[r] - kGap, k.dtype), kGap * es));
    }
  }
  if (!k.in_place) res.expect("send buffer", check_move(k.dtype, rank, send, 0, counts[rank]));
}

void reduce_scatter_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), rank = c.rank(), es = dtype_size(k.dtype);
  Buffer send(size * n * es), own(k.in_place ? 0 : n * es);
  fill_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, size * n);
  uint8_t* out = k.in_place ? element(send.data(), rank * n, k.dtype) : own.data();
  c.reduce_scatter(send.data(), out, n, k.dtype, k.op).wait();
  res.expect("result", ReduceExpectation(k.dtype, k.op, c.size()).check(out, rank * n, n));
  if (!k.in_place) {
    res.expect("send buffer",
               check_reduce_input(k.dtype, k.op, c.rank(), send.data(), 0, size * n));
  }
}

void gather_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), rank = c.rank(), es = dtype_size(k.dtype);
  const bool is_root = c.rank() == k.root;
  Buffer recv(size * n * es), own(k.in_place && is_root ? 0 : n * es);
  // In place on the root: its block of recv is the send buffer (as allgather).
  uint8_t* send = k.in_place && is_root ? element(recv.data(), rank * n, k.dtype) : own.data();
  fill_move(k.dtype, c.rank(), send, 0, n);
  c.gather(send, recv.data(), n, k.dtype, k.root).wait();
  if (is_root) {
    for (size_t r = 0; r < size; ++r) {
      res.expect(("block of rank " + std::to_string(r)).c_str(),
                 check_move(k.dtype, static_cast<int>(r), element(recv.data(), r * n, k.dtype), 0,
                            n));
    }
  }
  if (!(k.in_place && is_root)) res.expect("send buffer", check_move(k.dtype, c.rank(), send, 0, n));
}

void scatter_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), rank = c.rank(), es = dtype_size(k.dtype);
  const bool is_root = c.rank() == k.root;
  Buffer send(size * n * es), own(k.in_place && is_root ? 0 : n * es);
  if (is_root) {
    for (size_t r = 0; r < size; ++r) {
      fill_move(k.dtype, static_cast<int>(r), element(send.data(), r * n, k.dtype), 0, n);
    }
  }
  // In place on the root: its block of send is the recv buffer (as reduce_scatter).
  uint8_t* out = k.in_place && is_root ? element(send.data(), rank * n, k.dtype) : own.data();
  c.scatter(send.data(), out, n, k.dtype, k.root).wait();
  res.expect("result", check_move(k.dtype, c.rank(), out, 0, n));
  if (is_root && !k.in_place) {
    for (size_t r = 0; r < size; ++r) {
      res.expect("root's send buffer", check_move(k.dtype, static_cast<int>(r),
                                                  element(send.data(), r * n, k.dtype), 0, n));
    }
  }
}

void alltoall_case(Communicator& c, const Case& k, RankResult& res) {
  const size_t n = k.count, size = c.size(), rank = c.rank(), es = dtype_size(k.dtype);
  // Element j of the block for rank q of rank r's send is move_value(r, q*n + j).
  Buffer send(size * n * es), own(k.in_place ? 0 : size * n * es);
  fill_move(k.dtype, c.rank(), send.data(), 0, size * n);
  uint8_t* out = k.in_place ? send.data() : own.data();
  c.alltoall(send.data(), out, n, k.dtype).wait();
  for (size_t p = 0; p < size; ++p) {
    res.expect(("block from rank " + std::to_string(p)).c_str(),
               check_move(k.dtype, static_cast<int>(p), element(out, p * n, k.dtype), rank * n, n));
  }
  if (!k.in_place) res.expect("send buffer", check_move(k.dtype, c.rank(), send.data(), 0, size * n));
}

// Elements rank `from` sends to rank `to` in alltoallv: varied, some empty.
size_t alltoallv_count(size_t n, int from, int to) {
  if (n == 0) return 0;
  if ((from + 2 * to) % 4 == 3) return 0;
  return n + static_cast<size_t>((from * 3 + to) % 5);
}

void alltoallv_case(Communicator& c, const Case& k, RankResult& res) {
  const int size = c.size(), rank = c.rank();
  const size_t es = dtype_size(k.dtype), n = k.count, stride = n + 8;
  std::vector<size_t> send_counts(size), send_displs(size), recv_counts(size), recv_displs(size);
  // Send blocks in reverse rank order with 2-element gaps; recv blocks in order with
  // 1-element gaps. Gaps of recv must stay untouched.
  size_t send_total = 0, recv_total = 0;
  for (int q = size - 1; q >= 0; --q) {
    send_total += 2;
    send_displs[q] = send_total;
    send_counts[q] = alltoallv_count(n, rank, q);
    send_total += send_counts[q];
  }
  for (int p = 0; p < size; ++p) {
    recv_total += 1;
    recv_displs[p] = recv_total;
    recv_counts[p] = alltoallv_count(n, p, rank);
    recv_total += recv_counts[p];
  }
  Buffer send(send_total * es), recv(recv_total * es);
  for (int q = 0; q < size; ++q) {
    fill_move(k.dtype, rank, element(send.data(), send_displs[q], k.dtype), q * stride,
              send_counts[q]);
  }
  c.alltoallv(send.data(), send_counts, send_displs, recv.data(), recv_counts, recv_displs,
              k.dtype)
      .wait();
  for (int p = 0; p < size; ++p) {
    res.expect(("block from rank " + std::to_string(p)).c_str(),
               check_move(k.dtype, p, element(recv.data(), recv_displs[p], k.dtype),
                          rank * stride, recv_counts[p]));
    res.expect("gap before a recv block",
               check_sentinel(element(recv.data(), recv_displs[p] - 1, k.dtype), es));
  }
}

// ----- the tests -----

class CollectivesTest : public ::testing::TestWithParam<int> {};

std::vector<DataType> all_dtypes() {
  if (quick_sweep()) return {DataType::kFloat32};
  return std::vector<DataType>(std::begin(kAllDataTypes), std::end(kAllDataTypes));
}
std::vector<DataType> big_subset() {
  if (quick_sweep()) return {DataType::kFloat32};
  return std::vector<DataType>(std::begin(kBigSubset), std::end(kBigSubset));
}

TEST_P(CollectivesTest, Allreduce) {
  const int size = GetParam();
  // Large count: every dtype x op with the automatic choice; a few with each forced
  // algorithm (below), so that each algorithm moves a large non-divisible buffer.
  std::vector<Case> cases = make_cases("allreduce", size, /*reducing=*/true, /*rooted=*/false,
                                       /*in_place=*/true, /*algorithm_specific=*/false,
                                       all_dtypes());
  for (Algorithm algorithm : kAlgorithms) {
    if (algorithm == Algorithm::kAuto || !swept("allreduce", algorithm)) continue;
    for (auto [dtype, op] : {std::pair{DataType::kFloat32, ReduceOp::kSum},
                             std::pair{DataType::kBFloat16, ReduceOp::kAvg},
                             std::pair{DataType::kInt8, ReduceOp::kMax}}) {
      if (quick_sweep() && dtype != DataType::kFloat32) continue;
      for (bool in_place : {false, true}) {
        Case k;
        k.collective = "allreduce";
        k.algorithm = algorithm;
        k.dtype = dtype;
        k.op = op;
        k.count = kBig;
        k.in_place = in_place;
        k.reducing = true;
        cases.push_back(k);
      }
    }
  }
  run_sweep(size, cases, allreduce_case, /*identical_results=*/true);
}

TEST_P(CollectivesTest, Broadcast) {
  run_sweep(GetParam(),
            make_cases("broadcast", GetParam(), false, true, true, false, big_subset()),
            broadcast_case);
}

TEST_P(CollectivesTest, Reduce) {
  run_sweep(GetParam(), make_cases("reduce", GetParam(), true, true, true, false, big_subset()),
            reduce_case);
}

TEST_P(CollectivesTest, Allgather) {
  run_sweep(GetParam(), make_cases("allgather", GetParam(), false, false, true, true, big_subset()),
            allgather_case);
}

TEST_P(CollectivesTest, Allgatherv) {
  run_sweep(GetParam(),
            make_cases("allgatherv", GetParam(), false, false, true, false, big_subset(), 2),
            allgatherv_case);
}

TEST_P(CollectivesTest, ReduceScatter) {
  run_sweep(GetParam(),
            make_cases("reduce_scatter", GetParam(), true, false, true, true, big_subset()),
            reduce_scatter_case);
}

TEST_P(CollectivesTest, Gather) {
  run_sweep(GetParam(), make_cases("gather", GetParam(), false, true, true, false, big_subset()),
            gather_case);
}

TEST_P(CollectivesTest, Scatter) {
  run_sweep(GetParam(), make_cases("scatter", GetParam(), false, true, true, false, big_subset()),
            scatter_case);
}

TEST_P(CollectivesTest, Alltoall) {
  run_sweep(GetParam(), make_cases("alltoall", GetParam(), false, false, true, false, big_subset()),
            alltoall_case);
}

TEST_P(CollectivesTest, Alltoallv) {
  run_sweep(GetParam(),
            make_cases("alltoallv", GetParam(), false, false, false, false, big_subset()),
            alltoallv_case);
}

// No rank leaves a barrier before every rank has entered it. Ranks enter in a
// staggered order (a stagger, not synchronization: correctness does not depend on it).
TEST_P(CollectivesTest, Barrier) {
  const int size = GetParam();
  constexpr int kRounds = 20;
  for (Algorithm algorithm : kAlgorithms) {
    if (!swept("barrier", algorithm)) continue;
    test::RankGroup group(size, sweep_options(algorithm, size));
    std::vector<std::atomic<int>> arrived(kRounds);
    group.run([&](Communicator& c) {
      for (int round = 0; round < kRounds; ++round) {
        if ((c.rank() + round) % size == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        arrived[round].fetch_add(1);
        c.barrier().wait();
        EXPECT_EQ(arrived[round].load(), size)
            << "size=" << size << " algorithm=" << algorithm_name(algorithm) << " round "
            << round << ": rank " << c.rank() << " left the barrier before every rank entered";
      }
    });
  }
}

// Point to point: every ordered pair (a, b) exchanges two messages a -> b, in one global
// order of pairs (so that no schedule can deadlock even if a send waits for its recv);
// checks contents and that messages between two ranks arrive in the order sent.
TEST_P(CollectivesTest, SendRecv) {
  const int size = GetParam();
  if (size == 1) GTEST_SKIP() << "no peer to send to";
  std::vector<Case> cases;
  for (Algorithm algorithm : kAlgorithms) {
    if (!swept("send/recv", algorithm)) continue;
    for (size_t count : kSmallCounts) {
      for (DataType dtype : kAllDataTypes) {
        Case k;
        k.collective = "send/recv";
        k.algorithm = algorithm;
        k.dtype = dtype;
        k.count = count;
        cases.push_back(k);
      }
    }
  }
  Case big;
  big.collective = "send/recv";
  big.count = kBig;
  cases.push_back(big);

  run_sweep(size, cases, [](Communicator& c, const Case& k, RankResult& res) {
    const int world = c.size(), rank = c.rank();
    const size_t es = dtype_size(k.dtype), stride = 2 * (k.count + 4);
    auto message_count = [&](int from, int to, int which) -> size_t {
      return k.count == 0 ? 0 : k.count + static_cast<size_t>((from + to + which) % 3);
    };
    for (int a = 0; a < world; ++a) {
      for (int b = 0; b < world; ++b) {
        if (a == b || (rank != a && rank != b)) continue;
        // Message `which` from a to b holds move_value(a, b*stride*2 + which*stride + j).
        auto first = [&](int which) { return (static_cast<size_t>(b) * 2 + which) * stride; };
        if (rank == a) {
          Buffer m0(message_count(a, b, 0) * es), m1(message_count(a, b, 1) * es);
          fill_move(k.dtype, a, m0.data(), first(0), message_count(a, b, 0));
          fill_move(k.dtype, a, m1.data(), first(1), message_count(a, b, 1));
          Work w0 = c.send(m0.data(), message_count(a, b, 0), k.dtype, b);
          Work w1 = c.send(m1.data(), message_count(a, b, 1), k.dtype, b);
          w0.wait();
          w1.wait();
        } else {
          Buffer m0(message_count(a, b, 0) * es), m1(message_count(a, b, 1) * es);
          Work w0 = c.recv(m0.data(), message_count(a, b, 0), k.dtype, a);
          Work w1 = c.recv(m1.data(), message_count(a, b, 1), k.dtype, a);
          w0.wait();
          w1.wait();
          const std::string from = "message from rank " + std::to_string(a);
          res.expect((from + " #0").c_str(),
                     check_move(k.dtype, a, m0.data(), first(0), message_count(a, b, 0)));
          res.expect((from + " #1").c_str(),
                     check_move(k.dtype, a, m1.data(), first(1), message_count(a, b, 1)));
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSize, CollectivesTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace chorus
