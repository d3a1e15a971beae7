// The seed jobs' process tuning (process_tuning.h).
#include "process_tuning.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace chorus::mnist {

// Debian 12's OpenBLAS (0.3.21) does not know recent Intel CPUs (Sapphire and Emerald
// Rapids among them) and falls back to its generic "Prescott" SSE3 kernels: a GEMM of
// this job ran at 28 GFLOP/s there, against 110-130 with the AVX-512 kernels the CPU
// has. OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE, hence the
// run again with it set.
void prefer_native_blas_kernels(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) return;
  }
  // The kernel names a process after the file it runs: "exe" after the run through
  // /proc/self/exe below, which ps -C, pgrep and top would then show.
  const char* slash = std::strrchr(argv[0], '/');
  prctl(PR_SET_NAME, slash != nullptr ? slash + 1 : argv[0]);
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || openblas_core() != "Prescott") return;
  __builtin_cpu_init();
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core == nullptr) return;
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (local_rank == nullptr || std::strcmp(local_rank, "0") == 0) {
    std::fprintf(stderr,
                 "%s: OpenBLAS fell back to its generic Prescott kernels on this CPU; running "
                 "again with OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose)\n",
                 argv[0], core);
  }
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "%s: running again failed (%s); going on with the generic kernels\n",
               argv[0], std::strerror(errno));
}

// OpenBLAS's own functions, looked up rather than linked: libtorch may compute on
// another BLAS, which has neither.
std::string openblas_core() {
  using CoreName = char* (*)();
  auto* name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return name ? std::string(name()) : std::string();
}

int set_compute_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    n = omp ? std::max(1, std::atoi(omp)) : 1;
  }
  torch::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
  return n;
}

// glibc's malloc gives large freed blocks back to the kernel: a block above the mmap
// threshold is unmapped when freed, and free memory at the top of a heap is trimmed
// past the trim threshold; both thresholds move with the sizes freed. A training step
// frees and allocates the same tensors again every step (a batch of 512 images is 1.6
// MB), so their pages came back as page faults every step: 300 steps of this job took
// 180,000 to 370,000 faults (the most under chorusrun; why the launcher doubles them
// was not pinned down), against 60,000 with both thresholds fixed, and 1 rank trained
// 6-10% faster.
std::string keep_freed_memory() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return "user";
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc accepts on 64-bit
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return "fixed";
}

}  // namespace chorus::mnist
