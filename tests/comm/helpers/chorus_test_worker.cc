// A worker process for tests/comm/process_test.cc: one rank of an `env://` job
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Communicator::from_env()).
//
// Usage: chorus_test_worker allreduce-loop ITERS COUNT
//   Runs ITERS allreduces (0: until killed) of COUNT f32 elements and checks every
//   result. Prints "started" on stdout once the first allreduce has completed (the
//   whole group is connected), and "ok" at the end.
//
// Exit codes: 0 success; 2 bad command line; 3 chorus::Error (its what() on stderr);
// 4 any other exception; 5 a wrong result.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
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
  std::vector<float> buf(count);
  for (long iter = 0; iters == 0 || iter < iters; ++iter) {
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i, iter);
    comm->allreduce(buf.data(), count, chorus::DataType::kFloat32, chorus::ReduceOp::kSum).wait();
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
  std::printf("ok\n");
  std::fflush(stdout);
  return 0;
}

int usage() {
  std::fprintf(stderr, "usage: chorus_test_worker allreduce-loop ITERS COUNT\n");
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
    return usage();
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus error (%s): %s\n", chorus::error_kind_name(e.kind()), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    return 4;
  }
}
