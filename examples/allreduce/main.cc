// Every rank adds its numbers into one sum. Run it under chorusrun, which sets RANK,
// WORLD_SIZE and where the store is; Communicator::from_env() reads them:
//   chorusrun --nproc-per-node 4 ./allreduce [count]
#include <chorus/chorus.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1000;
  try {
    auto comm = chorus::Communicator::from_env();
    const int rank = comm->rank(), size = comm->size();
    // Rank r holds r + i at element i: the sum is size * i + size * (size - 1) / 2.
    std::vector<double> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = rank + static_cast<double>(i);
    comm->allreduce(data.data(), count, chorus::DataType::kFloat64, chorus::ReduceOp::kSum).wait();
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != size * static_cast<double>(i) + size * (size - 1) / 2.0) ++wrong;
    }
    std::printf("rank %d of %d: allreduce of %zu doubles, %zu wrong (chorus %s)\n", rank, size,
                count, wrong, chorus::library_version());
    return wrong == 0 ? 0 : 1;
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "allreduce: %s\n", e.what());
    return 1;
  }
}
