// memcpy-bench: memcpy's bandwidth on this machine, the memcpy column of
// bench/compare_allreduce.sh: how fast one core moves the bytes of an allreduce of the
// same size, measured in the same run as the libraries.
//
// Usage: memcpy-bench [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
//                     [-x 0|1]
// Sizes take K/M/G suffixes (powers of 1024), as in bench/mpi_allreduce.c. For every
// size it runs WARMUP copies, then ITERS back-to-back std::memcpy calls between two
// buffers of that size (the same two every time, both touched beforehand, so no page is
// faulted in while timed); the time per copy is the average.
// -x 1: across cores instead. A thread on one CPU writes the source (a memcpy from its
// own buffer), then a thread on another CPU copies it out; only the second copy is
// timed. That is what every allreduce inside a node pays for the bytes it moves
// between ranks (each of 2 ranks brings in half of the data from the other's core and
// hands it half of the results), whose busbw therefore cannot pass this GB/s. Needs two
// CPUs in the affinity mask. It prints one line per size:
//   size_bytes time_us wrong_bytes
// where GB/s = size_bytes / (time_us * 1e3), and wrong_bytes counts the bytes of the
// destination that differ from the source after the last copy (must be 0). Lines
// starting with '#' are comments.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  size_t min_bytes = 8, max_bytes = size_t{256} << 20, factor = 2;
  size_t iters = 20, warmup = 5;
  size_t cross = 0;  // -x
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "memcpy-bench: %s\n", message.c_str());
  std::exit(2);
}

size_t parse_size(const char* opt, const std::string& text) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || text[0] == '-') usage_error("bad value '" + text + "' for " + opt);
  const std::string unit = text.substr(used);
  size_t shift = 0;
  if (unit == "K" || unit == "k") shift = 10;
  else if (unit == "M" || unit == "m") shift = 20;
  else if (unit == "G" || unit == "g") shift = 30;
  else if (!unit.empty()) usage_error("bad value '" + text + "' for " + opt);
  return static_cast<size_t>(v) << shift;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string opt = argv[i];
    if (i + 1 >= argc) usage_error("missing value for " + opt);
    size_t* field = opt == "-b" ? &o.min_bytes : opt == "-e" ? &o.max_bytes
                  : opt == "-f" ? &o.factor : opt == "-n" ? &o.iters
                  : opt == "-w" ? &o.warmup : opt == "-x" ? &o.cross : nullptr;
    if (field == nullptr) usage_error("unknown option '" + opt + "' (want -b -e -f -n -w -x)");
    *field = parse_size(opt.c_str(), argv[i + 1]);
  }
  if (o.factor < 2 || o.iters < 1 || o.min_bytes < 1 || o.min_bytes > o.max_bytes || o.cross > 1)
    usage_error("need -f >= 2, -n >= 1, 1 <= -b <= -e, -x 0 or 1");
  return o;
}

// Keeps the compiler from dropping or merging copies whose destination it never sees
// read: each one may be read here.
void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// The first two CPUs this process may run on; exits 2 when there are fewer.
std::pair<int, int> two_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) usage_error("sched_getaffinity failed");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.size() < 2) usage_error("-x 1 needs two CPUs in the affinity mask");
  return {cpus[0], cpus[1]};
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// -x 1: microseconds per copy, averaged over `iters` after `warmup`, of a thread on the
// second CPU copying `from` (just written by the first CPU, from `src`) into `dst`. The
// threads take turns through one flag; a turn's wait is not timed.
double cross_core_us(const Options& o, std::pair<int, int> cpus, size_t bytes, const unsigned char* src,
                     unsigned char* from, unsigned char* dst) {
  const auto [writer_cpu, reader_cpu] = cpus;
  std::atomic<int> turn{0};  // 0: the writer's, 1: the reader's
  double timed_us = 0;
  const size_t rounds = o.warmup + o.iters;
  std::thread reader([&, reader_cpu = reader_cpu] {
    pin(reader_cpu);
    for (size_t i = 0; i < rounds; ++i) {
      while (turn.load(std::memory_order_acquire) != 1) {
      }
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(dst, from, bytes);
      clobber(dst);
      const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
      if (i >= o.warmup) timed_us += took.count();
      turn.store(0, std::memory_order_release);
    }
  });
  pin(writer_cpu);
  for (size_t i = 0; i < rounds; ++i) {
    while (turn.load(std::memory_order_acquire) != 0) {
    }
    std::memcpy(from, src, bytes);
    clobber(from);
    turn.store(1, std::memory_order_release);
  }
  reader.join();
  return timed_us / static_cast<double>(o.iters);
}

// Microseconds per copy of `bytes` from src to dst by this thread, averaged over
// `iters` back-to-back copies after `warmup`.
double one_process_us(const Options& o, size_t bytes, const unsigned char* src, unsigned char* dst) {
  for (size_t i = 0; i < o.warmup; ++i) {
    std::memcpy(dst, src, bytes);
    clobber(dst);
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < o.iters; ++i) {
    std::memcpy(dst, src, bytes);
    clobber(dst);
  }
  const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(o.iters);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  // -x 1: the CPUs are read before this thread is pinned to the first of them.
  const std::pair<int, int> cpus = o.cross ? two_cpus() : std::pair<int, int>{};
  // Distinct values in both buffers, so that a copy that did not happen shows.
  std::vector<unsigned char> src(o.max_bytes), dst(o.max_bytes, 0), from(o.cross ? o.max_bytes : 0, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::printf(o.cross ? "# memcpy across cores, 2 threads: size_bytes time_us wrong_bytes\n"
                      : "# memcpy, 1 process: size_bytes time_us wrong_bytes\n");
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    const double us = o.cross ? cross_core_us(o, cpus, bytes, src.data(), from.data(), dst.data())
                              : one_process_us(o, bytes, src.data(), dst.data());
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) wrong += dst[i] != src[i];
    // Six decimals: a copy of a few bytes takes about a nanosecond.
    std::printf("%zu %.6f %zu\n", bytes, us, wrong);
    std::fflush(stdout);
    std::memset(dst.data(), 0, bytes);  // the next size's check sees only its own copy
    if (bytes > o.max_bytes / o.factor) break;
  }
  return 0;
}
