// The seed jobs' models, shared by chorus-mnist and bench/plain_libtorch_mnist.cc so
// that both train exactly the same network.
#pragma once

#include <dlfcn.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace chorus::mnist {

// Sets the threads of one rank's compute: libtorch's intra-op pool and, when libtorch
// runs on OpenBLAS (Debian's libtorch takes whichever libblas.so.3 the system selects),
// OpenBLAS's own pool, which libtorch does not size. `requested` 0 means
// OMP_NUM_THREADS, or 1 when that is unset. Returns the count set.
inline int set_compute_threads(int requested) {
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

// The kernels OpenBLAS chose when it loaded ("SkylakeX", "Haswell", ...), or "" when
// libtorch does not compute on OpenBLAS.
inline std::string openblas_core() {
  using CoreName = char* (*)();
  auto* name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return name ? std::string(name()) : std::string();
}

// Debian 12's OpenBLAS (0.3.21) does not know recent Intel CPUs (Sapphire and Emerald
// Rapids among them) and falls back to its generic "Prescott" SSE3 kernels: a GEMM of
// this job ran at 28 GFLOP/s there, against 110-130 with the AVX-512 kernels the CPU
// has. OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE, so when it
// fell back on a CPU with AVX-512 (or AVX2 and FMA) this program runs itself again
// (same pid, arguments and environment) with OPENBLAS_CORETYPE naming those kernels.
// An OPENBLAS_CORETYPE that is already set is the user's choice and is kept.
inline void prefer_native_blas_kernels(char** argv) {
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

// glibc's malloc gives large freed blocks back to the kernel: a block above the mmap
// threshold is unmapped when freed, and free memory at the top of a heap is trimmed
// past the trim threshold; both thresholds move with the sizes freed. A training step
// frees and allocates the same tensors again every step (a batch of 512 images is 1.6
// MB), so their pages came back as page faults every step: 300 steps of this job took
// 180,000 to 370,000 faults (the most under chorusrun; why the launcher doubles them
// was not pinned down), against 60,000 with both thresholds fixed, and 1 rank trained
// 6-10% faster. Fixed, freed memory stays in the process for
// the next step. Returns "fixed", or "user" when the user set either threshold
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES), which is kept.
inline std::string keep_freed_memory() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return "user";
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc accepts on 64-bit
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return "fixed";
}

// NeuralNetwork of seed 000: Flatten, then Linear/ReLU/Linear/ReLU/Linear. Layers are
// created in the same order as in PyTorch, so torch::manual_seed gives the same weights.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    // One statement per layer: the order of function arguments' evaluation is
    // unspecified in C++ (GCC goes right to left), and the layers must draw their
    // initial weights in PyTorch's order.
    torch::nn::Linear fc1(784, 512);
    torch::nn::Linear fc2(512, 512);
    torch::nn::Linear fc3(512, 10);
    stack = register_module("linear_relu_stack",
                            torch::nn::Sequential(fc1, torch::nn::ReLU(), fc2, torch::nn::ReLU(), fc3));
  }
  torch::Tensor forward(torch::Tensor x) { return stack->forward(x.flatten(1)); }
  torch::nn::Sequential stack{nullptr};
};
TORCH_MODULE(Mlp);

// SimpleModel of seed 001.
struct LinearImpl : torch::nn::Module {
  LinearImpl() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x.flatten(1)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Linear);

}  // namespace chorus::mnist
