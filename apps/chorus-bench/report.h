// chorus-bench's output on rank 0: a commented header and one table row per size, or
// with --json one JSON object per line (bench/compare_*.sh and the tests parse both).
#pragma once

#include "measure.h"

namespace chorus::bench {

// "# chorus-bench OP: ..." and the column names; not printed with --json.
void print_header(const Bench& b);
// One row, flushed at once: with --json one line per layout measured.
void print_row(const Bench& b, const Row& r);

}  // namespace chorus::bench
