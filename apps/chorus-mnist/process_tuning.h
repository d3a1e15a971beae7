// How the seed jobs tune the process they compute in, apart from what they train:
// OpenBLAS's kernels, the compute thread pools and glibc's malloc. Shared by
// chorus-mnist and bench/plain_libtorch_mnist.cc, so that the baseline runs in the same
// process as the job it is compared with. Each call reads the environment, where the
// user's own setting is kept.
#pragma once

#include <string>

namespace chorus::mnist {

// When OpenBLAS fell back to its generic "Prescott" kernels on a CPU that has AVX-512
// (or AVX2 and FMA), runs this program again (same pid, arguments and environment)
// with OPENBLAS_CORETYPE naming the kernels the CPU has, and says so on stderr (on
// LOCAL_RANK 0, or when alone). Returns where it did not: no need, OPENBLAS_CORETYPE
// already set (the user's choice), the run again failed (said on stderr; the program
// goes on with the generic kernels), or the arguments ask for --version, which prints
// the version and nothing else (--help runs again like any other run:
// bench/compare_mnist.sh reads a --help run's kernels). Call it first in main(), with
// main's argc and argv.
void prefer_native_blas_kernels(int argc, char** argv);

// The kernels OpenBLAS chose when it loaded ("SkylakeX", "Haswell", ...), or "" when
// libtorch does not compute on OpenBLAS.
std::string openblas_core();

// Sets the threads of one rank's compute: libtorch's intra-op pool and, when libtorch
// runs on OpenBLAS (Debian's libtorch takes whichever libblas.so.3 the system selects),
// OpenBLAS's own pool, which libtorch does not size. `requested` 0 means
// OMP_NUM_THREADS, or 1 when that is unset. Returns the count set.
int set_compute_threads(int requested);

// Fixes glibc's mmap and trim thresholds, so that the memory a training step frees
// stays in the process for the next step instead of coming back as page faults.
// Returns "fixed", or "user" when the user set either threshold
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES), which is kept.
std::string keep_freed_memory();

}  // namespace chorus::mnist
