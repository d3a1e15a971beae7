// memcpy-bench: memcpy's bandwidth on this machine, the memcpy column of
// bench/compare_allreduce.sh: how fast one core moves the bytes of an allreduce of the
// same size, measured in the same run as the libraries.
//
// Usage: memcpy-bench [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
// Sizes take K/M/G suffixes (powers of 1024), as in bench/mpi_allreduce.c. For every
// size it runs WARMUP copies, then ITERS back-to-back std::memcpy calls between two
// buffers of that size (the same two every time, both touched beforehand, so no page is
// faulted in while timed); the time per copy is the average. It prints one line per
// size:
//   size_bytes time_us wrong_bytes
// where GB/s = size_bytes / (time_us * 1e3), and wrong_bytes counts the bytes of the
// destination that differ from the source after the last copy (must be 0). Lines
// starting with '#' are comments.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  size_t min_bytes = 8, max_bytes = size_t{256} << 20, factor = 2;
  size_t iters = 20, warmup = 5;
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
                  : opt == "-w" ? &o.warmup : nullptr;
    if (field == nullptr) usage_error("unknown option '" + opt + "' (want -b -e -f -n -w)");
    *field = parse_size(opt.c_str(), argv[i + 1]);
  }
  if (o.factor < 2 || o.iters < 1 || o.min_bytes < 1 || o.min_bytes > o.max_bytes)
    usage_error("need -f >= 2, -n >= 1, 1 <= -b <= -e");
  return o;
}

// Keeps the compiler from dropping or merging copies whose destination it never sees
// read: each one may be read here.
void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  // Distinct values in both buffers, so that a copy that did not happen shows.
  std::vector<unsigned char> src(o.max_bytes), dst(o.max_bytes, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::printf("# memcpy, 1 process: size_bytes time_us wrong_bytes\n");
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    for (size_t i = 0; i < o.warmup; ++i) {
      std::memcpy(dst.data(), src.data(), bytes);
      clobber(dst.data());
    }
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < o.iters; ++i) {
      std::memcpy(dst.data(), src.data(), bytes);
      clobber(dst.data());
    }
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) wrong += dst[i] != src[i];
    // Six decimals: a copy of a few bytes takes about a nanosecond.
    std::printf("%zu %.6f %zu\n", bytes, elapsed.count() / static_cast<double>(o.iters), wrong);
    std::fflush(stdout);
    std::memset(dst.data(), 0, bytes);  // the next size's check sees only its own copy
    if (bytes > o.max_bytes / o.factor) break;
  }
  return 0;
}
