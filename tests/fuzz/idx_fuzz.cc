// libFuzzer target: the IDX reader (src/torch/data/idx.h) on any file contents, raw or
// gzip. It must either return an array whose payload matches its dimensions or throw
// DataError; anything else (another exception, a crash, an allocation driven by a
// corrupt header) is a finding. The first byte picks 1 or 3 dimensions.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "chorus/torch/data.h"
#include "torch/data/idx.h"

namespace {

// One in-memory file for the whole run, rewritten for every input.
int memory_file() {
  static int fd = [] {
    int f = memfd_create("idx_fuzz", 0);
    if (f < 0) {
      std::perror("idx_fuzz: memfd_create");
      std::abort();
    }
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int num_dims = (data[0] & 1) ? 3 : 1;
  int fd = memory_file();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data + 1, size - 1, 0) != static_cast<ssize_t>(size - 1)) {
    std::perror("idx_fuzz: writing the memory file");
    std::abort();
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    chorus::data::IdxArray array = chorus::data::read_idx(path, num_dims);
    if (array.dims.size() != static_cast<size_t>(num_dims)) std::abort();
    uint64_t product = 1;
    for (int64_t d : array.dims) product *= static_cast<uint64_t>(d);
    if (product != array.bytes.size()) {
      std::fprintf(stderr, "idx_fuzz: payload of %zu bytes for dimensions of product %llu\n",
                   array.bytes.size(), static_cast<unsigned long long>(product));
      std::abort();
    }
  } catch (const chorus::data::DataError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) {
      std::fprintf(stderr, "idx_fuzz: error does not name the file: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
