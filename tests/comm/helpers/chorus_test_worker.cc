// A worker process for tests/comm/process/process_test.cc: one rank of an `env://` job
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Communicator::from_env()).
//
// Usage: chorus_test_worker allreduce-loop ITERS COUNT
//   Runs ITERS allreduces (0: until killed) of COUNT f32 elements and checks every
//   result. Prints "started" on stdout once the first allreduce has completed (the
//   whole group is connected), and "ok" at the end. With CHORUS_TEST_SHARED=1 the
//   buffer is node-shared memory (chorus::allocate_shared: the direct path), and the
//   worker prints "mapped N" (the peers' buffers it maps, from /proc/self/maps) before
//   "ok".
//
// Usage: chorus_test_worker collectives-loop ITERS MAX_COUNT SEED
//   For tests/comm/process/fault_test.cc. Runs ITERS operations (0: until killed), op I being
//   kind I % 12 of: allreduce, broadcast, reduce, allgather, allgatherv,
//   reduce_scatter, gather, scatter, alltoall, alltoallv, barrier, sendrecv (a send to
//   the next rank and a recv from the previous one), with a count in [1, MAX_COUNT]
//   f32 elements drawn from SEED and I (the same on every rank) and the root I % size;
//   checks every result. Before issuing op I it prints "op I KIND count N" on stdout
//   (flushed), so that a test can pick the operation during which it kills or stops a
//   rank; "started" after op 0 completed. On a chorus::Error it prints
//   "worker: rank R failed in op I (KIND)" on stderr before the error itself.
//
// Usage: chorus_test_worker first-waiter COUNT
//   One in-place allreduce of COUNT f32 elements on node-shared memory, after a
//   barrier. Every rank but 0 issues it and stops itself (SIGSTOP) without waiting for
//   it; rank 0 waits for it and prints "reduced" once it has the result, so the test
//   sees that the first rank to wait did every piece of the call while its peers held
//   no core. Once continued (SIGCONT), a peer checks that its buffer already holds the
//   result, then waits. Every rank prints "ok" after a last barrier.
//
// Usage: chorus_test_worker elastic-round ROUND
//   For tests/run/elastic_test.cc. Prints its place from the launcher's environment,
//   "rank R world W local L/LW group G/GW restart C" (stdout), then one checked
//   allreduce of 16 f32 elements across the world and "allreduced". In a round before
//   ROUND (CHORUS_RESTART_COUNT < ROUND) it then waits for its launcher to end the round
//   (sleeps, exiting 1 after 120 s, so that a round nobody ends fails the test); from
//   ROUND on it exits 0.
//
// Exit codes: 0 success; 2 bad command line; 3 chorus::Error (its what() on stderr);
// 4 any other exception; 5 a wrong result.
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace {

// Element i of `rank` in iteration `iter`: small integers, so f32 sums are exact.
float input(int rank, size_t i, long iter) {
  return static_cast<float>((rank + 1) + static_cast<long>((i + iter) % 5));
}

float expected(int size, size_t i, long iter) {
  return static_cast<float>(size * (size + 1) / 2 + size * static_cast<long>((i + iter) % 5));
}

// The node-shared memory files this process maps (its own and its peers').
int count_memory_files() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return -1;
  int n = 0;
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strstr(line, "/memfd:chorus-shared") != nullptr) ++n;
  }
  std::fclose(f);
  return n;
}

int allreduce_loop(long iters, size_t count) {
  auto comm = chorus::Communicator::from_env();
  const int rank = comm->rank(), size = comm->size();
  const char* restart = std::getenv("CHORUS_RESTART_COUNT");
  std::fprintf(stderr, "worker: rank %d of %d connected (pid %d, restart count %s)\n", rank, size,
               static_cast<int>(getpid()), restart ? restart : "unset");
  // fail-once: the rank named by CHORUS_TEST_FAIL_RANK exits 3 in the first attempt.
  const char* fail_rank = std::getenv("CHORUS_TEST_FAIL_RANK");
  // Every rank has connected (and said so) before the failing one leaves; otherwise the
  // launcher may stop a rank that is still setting up, and the test could not tell.
  if (fail_rank) comm->barrier().wait();
  if (fail_rank && std::atoi(fail_rank) == rank && (!restart || std::atoi(restart) == 0)) {
    std::fprintf(stderr, "worker: rank %d fails on purpose\n", rank);
    return 3;
  }
  const char* shared_env = std::getenv("CHORUS_TEST_SHARED");
  const bool shared = shared_env != nullptr && std::string(shared_env) == "1";
  std::vector<float> own(shared ? 0 : count);
  std::shared_ptr<chorus::SharedBuffer> shared_buf;
  if (shared) shared_buf = chorus::allocate_shared(count * sizeof(float));
  float* buf = shared ? static_cast<float*>(shared_buf->data()) : own.data();
  for (long iter = 0; iters == 0 || iter < iters; ++iter) {
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i, iter);
    comm->allreduce(buf, count, chorus::DataType::kFloat32, chorus::ReduceOp::kSum).wait();
    for (size_t i = 0; i < count; ++i) {
      if (buf[i] != expected(size, i, iter)) {
        std::fprintf(stderr, "worker rank %d: wrong allreduce result in iteration %ld at %zu: "
                     "expected %g, got %g\n", rank, iter, i, expected(size, i, iter), buf[i]);
        return 5;
      }
    }
    if (iter == 0) {
      std::printf("started\n");
      std::fflush(stdout);
    }
  }
  if (shared) std::printf("mapped %d\n", count_memory_files() - 1);
  std::printf("ok\n");
  std::fflush(stdout);
  return 0;
}

// ----- first-waiter -----

int first_waiter(size_t count) {
  auto comm = chorus::Communicator::from_env();
  const int rank = comm->rank(), size = comm->size();
  auto shared_buf = chorus::allocate_shared(count * sizeof(float));
  auto* buf = static_cast<float*>(shared_buf->data());
  for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i, 0);
  auto check = [&](const char* when) {
    for (size_t i = 0; i < count; ++i) {
      if (buf[i] != expected(size, i, 0)) {
        std::fprintf(stderr, "worker rank %d: %s, element %zu is %g, not the sum %g\n", rank, when, i,
                     buf[i], expected(size, i, 0));
        return false;
      }
    }
    return true;
  };
  comm->barrier().wait();
  chorus::Work w = comm->allreduce(buf, count, chorus::DataType::kFloat32, chorus::ReduceOp::kSum);
  if (rank == 0) {
    w.wait();
    if (!check("after its wait")) return 5;
    std::printf("reduced\n");
    std::fflush(stdout);
  } else {
    std::raise(SIGSTOP);
    if (!check("continued, before its wait")) return 5;
    w.wait();
    if (!check("after its wait")) return 5;
  }
  comm->barrier().wait();
  std::printf("ok\n");
  std::fflush(stdout);
  return 0;
}

// ----- elastic-round -----

int elastic_round(long until_round) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "unset");
  };
  std::printf("rank %s world %s local %s/%s group %s/%s restart %s\n", env("RANK").c_str(),
              env("WORLD_SIZE").c_str(), env("LOCAL_RANK").c_str(), env("LOCAL_WORLD_SIZE").c_str(),
              env("GROUP_RANK").c_str(), env("GROUP_WORLD_SIZE").c_str(),
              env("CHORUS_RESTART_COUNT").c_str());
  std::fflush(stdout);
  auto comm = chorus::Communicator::from_env();
  const int rank = comm->rank(), size = comm->size();
  constexpr size_t kCount = 16;
  std::vector<float> buf(kCount);
  for (size_t i = 0; i < kCount; ++i) buf[i] = input(rank, i, 0);
  comm->allreduce(buf.data(), kCount, chorus::DataType::kFloat32, chorus::ReduceOp::kSum).wait();
  for (size_t i = 0; i < kCount; ++i) {
    if (buf[i] != expected(size, i, 0)) {
      std::fprintf(stderr, "worker rank %d: wrong allreduce result at %zu: expected %g, got %g\n",
                   rank, i, expected(size, i, 0), buf[i]);
      return 5;
    }
  }
  std::printf("allreduced\n");
  std::fflush(stdout);
  const char* restart = std::getenv("CHORUS_RESTART_COUNT");
  if (restart != nullptr && std::atol(restart) >= until_round) return 0;
  sleep(120);
  return 1;
}

// ----- collectives-loop -----

constexpr const char* kKinds[] = {"allreduce",  "broadcast",      "reduce",  "allgather",
                                  "allgatherv", "reduce_scatter", "gather",  "scatter",
                                  "alltoall",   "alltoallv",      "barrier", "sendrecv"};
constexpr int kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);

// Reduction input of `rank` at element i of op `iter`: small integers (sums are exact).
float reduce_value(int rank, size_t i, long iter) {
  return static_cast<float>((rank + 1) + static_cast<long>((i + iter) % 5));
}
float reduce_sum(int size, size_t i, long iter) {
  return static_cast<float>(size * (size + 1) / 2 + size * static_cast<long>((i + iter) % 5));
}
// Data-movement value that identifies (rank, i) within f32's exact integers.
float move_value(int rank, size_t i, long iter) {
  return static_cast<float>(rank + 64 * static_cast<long>((i + static_cast<size_t>(iter)) % 65536));
}

struct Checker {
  int rank;
  long iter;
  const char* kind;
  bool ok = true;
  void expect(const float* got, size_t n, size_t first, float (*want)(int, size_t, long),
              int who, const char* what) {
    for (size_t i = 0; i < n && ok; ++i) {
      float w = want(who, first + i, iter);
      if (got[i] != w) {
        std::fprintf(stderr, "worker rank %d: wrong %s result in op %ld (%s) at %zu: expected "
                     "%g, got %g\n", rank, kind, iter, what, i, w, got[i]);
        ok = false;
      }
    }
  }
  void expect_sum(const float* got, size_t n, size_t first, int size) {
    for (size_t i = 0; i < n && ok; ++i) {
      float w = reduce_sum(size, first + i, iter);
      if (got[i] != w) {
        std::fprintf(stderr, "worker rank %d: wrong %s result in op %ld at %zu: expected %g, "
                     "got %g\n", rank, kind, iter, i, w, got[i]);
        ok = false;
      }
    }
  }
};

int collectives_loop(long iters, size_t max_count, unsigned long seed) {
  using chorus::DataType;
  using chorus::ReduceOp;
  auto comm = chorus::Communicator::from_env();
  const int rank = comm->rank(), size = comm->size();
  std::fprintf(stderr, "worker: rank %d of %d connected (pid %d)\n", rank, size,
               static_cast<int>(getpid()));
  const DataType f32 = DataType::kFloat32;
  std::vector<float> send, recv;
  long iter = 0;
  const char* kind = "";
  try {
    for (; iters == 0 || iter < iters; ++iter) {
      kind = kKinds[iter % kNumKinds];
      const std::string k = kind;
      std::mt19937_64 rng(seed * 1000003ull + static_cast<unsigned long>(iter));
      const size_t n = 1 + static_cast<size_t>(rng() % max_count);
      const int root = static_cast<int>(iter % size);
      std::printf("op %ld %s count %zu\n", iter, kind, n);
      std::fflush(stdout);
      Checker check{rank, iter, kind};
      const size_t all = n * static_cast<size_t>(size);
      send.assign(all, -1.0f);
      recv.assign(all, -1.0f);
      if (k == "allreduce") {
        for (size_t i = 0; i < n; ++i) send[i] = reduce_value(rank, i, iter);
        comm->allreduce(send.data(), recv.data(), n, f32, ReduceOp::kSum).wait();
        check.expect_sum(recv.data(), n, 0, size);
      } else if (k == "broadcast") {
        if (rank == root) for (size_t i = 0; i < n; ++i) send[i] = move_value(root, i, iter);
        comm->broadcast(send.data(), recv.data(), n, f32, root).wait();
        check.expect(recv.data(), n, 0, move_value, root, "broadcast");
      } else if (k == "reduce") {
        for (size_t i = 0; i < n; ++i) send[i] = reduce_value(rank, i, iter);
        comm->reduce(send.data(), recv.data(), n, f32, ReduceOp::kSum, root).wait();
        if (rank == root) check.expect_sum(recv.data(), n, 0, size);
      } else if (k == "allgather") {
        for (size_t i = 0; i < n; ++i) send[i] = move_value(rank, i, iter);
        comm->allgather(send.data(), recv.data(), n, f32).wait();
        for (int r = 0; r < size; ++r) check.expect(recv.data() + r * n, n, 0, move_value, r, "block");
      } else if (k == "allgatherv") {
        std::vector<size_t> counts(size);
        size_t total = 0;
        for (int r = 0; r < size; ++r) total += counts[r] = (r % 2 == 0) ? n : n / 2;
        recv.assign(total, -1.0f);
        for (size_t i = 0; i < counts[rank]; ++i) send[i] = move_value(rank, i, iter);
        comm->allgatherv(send.data(), counts[rank], recv.data(), counts, {}, f32).wait();
        size_t at = 0;
        for (int r = 0; r < size; ++r) {
          check.expect(recv.data() + at, counts[r], 0, move_value, r, "block");
          at += counts[r];
        }
      } else if (k == "reduce_scatter") {
        for (size_t i = 0; i < all; ++i) send[i] = reduce_value(rank, i, iter);
        comm->reduce_scatter(send.data(), recv.data(), n, f32, ReduceOp::kSum).wait();
        check.expect_sum(recv.data(), n, static_cast<size_t>(rank) * n, size);
      } else if (k == "gather") {
        for (size_t i = 0; i < n; ++i) send[i] = move_value(rank, i, iter);
        comm->gather(send.data(), recv.data(), n, f32, root).wait();
        if (rank == root) {
          for (int r = 0; r < size; ++r) check.expect(recv.data() + r * n, n, 0, move_value, r, "block");
        }
      } else if (k == "scatter") {
        if (rank == root) for (size_t i = 0; i < all; ++i) send[i] = move_value(root, i, iter);
        comm->scatter(send.data(), recv.data(), n, f32, root).wait();
        check.expect(recv.data(), n, static_cast<size_t>(rank) * n, move_value, root, "block");
      } else if (k == "alltoall") {
        for (size_t i = 0; i < all; ++i) send[i] = move_value(rank, i, iter);
        comm->alltoall(send.data(), recv.data(), n, f32).wait();
        for (int p = 0; p < size; ++p) {
          check.expect(recv.data() + p * n, n, static_cast<size_t>(rank) * n, move_value, p, "block");
        }
      } else if (k == "alltoallv") {
        // Rank a sends n - (a + b) % 2 elements to rank b, packed in rank order.
        auto cnt = [&](int a, int b) { return n - static_cast<size_t>((a + b) % 2); };
        std::vector<size_t> sc(size), sd(size), rc(size), rd(size);
        size_t st = 0, rt = 0;
        for (int q = 0; q < size; ++q) {
          sd[q] = st;
          st += sc[q] = cnt(rank, q);
          rd[q] = rt;
          rt += rc[q] = cnt(q, rank);
        }
        for (int q = 0; q < size; ++q) {
          for (size_t i = 0; i < sc[q]; ++i) send[sd[q] + i] = move_value(rank, q * n + i, iter);
        }
        comm->alltoallv(send.data(), sc, sd, recv.data(), rc, rd, f32).wait();
        for (int p = 0; p < size; ++p) {
          check.expect(recv.data() + rd[p], rc[p], static_cast<size_t>(rank) * n, move_value, p,
                       "block");
        }
      } else if (k == "barrier") {
        comm->barrier().wait();
      } else if (k == "sendrecv") {
        if (size > 1) {
          const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
          for (size_t i = 0; i < n; ++i) send[i] = move_value(rank, i, iter);
          // Even ranks send first, odd ranks receive first: no cycle even if a send
          // waits for its receive.
          chorus::Work s, r;
          if (rank % 2 == 0) {
            s = comm->send(send.data(), n, f32, next);
            r = comm->recv(recv.data(), n, f32, prev);
          } else {
            r = comm->recv(recv.data(), n, f32, prev);
            s = comm->send(send.data(), n, f32, next);
          }
          s.wait();
          r.wait();
          check.expect(recv.data(), n, 0, move_value, prev, "message");
        }
      }
      if (!check.ok) return 5;
      if (iter == 0) {
        std::printf("started\n");
        std::fflush(stdout);
      }
    }
  } catch (const chorus::Error&) {
    std::fprintf(stderr, "worker: rank %d failed in op %ld (%s)\n", rank, iter, kind);
    throw;
  }
  std::printf("ok\n");
  std::fflush(stdout);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: chorus_test_worker allreduce-loop ITERS COUNT\n"
               "       chorus_test_worker collectives-loop ITERS MAX_COUNT SEED\n"
               "       chorus_test_worker first-waiter COUNT\n"
               "       chorus_test_worker elastic-round ROUND\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  try {
    if (mode == "allreduce-loop" && argc == 4) {
      return allreduce_loop(std::strtol(argv[2], nullptr, 10),
                            static_cast<size_t>(std::strtoull(argv[3], nullptr, 10)));
    }
    if (mode == "first-waiter" && argc == 3) {
      return first_waiter(static_cast<size_t>(std::strtoull(argv[2], nullptr, 10)));
    }
    if (mode == "elastic-round" && argc == 3) return elastic_round(std::strtol(argv[2], nullptr, 10));
    if (mode == "collectives-loop" && argc == 5) {
      const long max_count = std::strtol(argv[3], nullptr, 10);
      if (max_count < 1) return usage();
      return collectives_loop(std::strtol(argv[2], nullptr, 10), static_cast<size_t>(max_count),
                              std::strtoul(argv[4], nullptr, 10));
    }
    return usage();
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus error (%s): %s\n", chorus::error_kind_name(e.kind()), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    return 4;
  }
}
