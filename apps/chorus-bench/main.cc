// chorus-bench: the collective benchmark, shaped like nccl-tests.
//
// Each rank runs the chosen collective over sizes from --minbytes to --maxbytes; rank 0
// prints one row per size (size, count, type, redop, algorithm, then time, algbw, busbw
// and wrong elements out of place and in place, as --mode asks), as a table or, with
// --json, as JSON lines (one per size and mode). --buffers shared allocates the buffers
// in node-shared memory (chorus::allocate_shared). Ranks come from the
// environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or --np N starts N local
// ranks of this same program on 127.0.0.1 and supervises them (launch.h); --nodes K
// then makes them K simulated nodes (CHORUS_NODE_ID), for the hierarchical algorithms.
//
// Files: options (command line), launch (--np), measure (timing and the check against
// the tests' element patterns), report (table and JSON rows).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "chorus/chorus.h"
#include "launch.h"
#include "measure.h"
#include "options.h"
#include "report.h"

namespace chorus::bench {
namespace {

int run_rank(const Options& o) {
  CommOptions comm_options = CommOptions::from_env();
  if (o.algorithm) comm_options.algorithm = *o.algorithm;
  std::shared_ptr<Communicator> comm = Communicator::from_env(comm_options);
  Bench b{*comm, o, kCollectives.at(o.collective), {}, {}};
  prepare_buffers(b);
  if (comm->rank() == 0 && !o.json) print_header(b);
  int64_t wrong = 0;
  for (uint64_t bytes = o.min_bytes;; bytes *= o.step_factor) {
    Row r = measure_size(b, bytes);
    if (r.out) wrong += r.out->wrong.value_or(0);
    if (r.in) wrong += r.in->wrong.value_or(0);
    if (comm->rank() == 0) print_row(b, r);
    if (bytes > o.max_bytes / o.step_factor) break;
  }
  comm->barrier().wait();
  if (wrong != 0 && comm->rank() == 0)
    std::fprintf(stderr, "chorus-bench: %lld wrong elements\n", static_cast<long long>(wrong));
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace chorus::bench

int main(int argc, char** argv) {
  using namespace chorus::bench;
  Options options = parse_options(argc, argv);
  try {
    if (options.np > 0) return launch_local_ranks(options, argc, argv);
    return run_rank(options);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "chorus-bench: rank %s: %s\n", rank ? rank : "0", e.what());
    return 1;
  }
}
