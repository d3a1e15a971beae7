#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// Dissemination barrier: in round k every rank signals rank + 2^k and waits for
// rank - 2^k; after ceil(log2(size)) rounds everyone has heard from everyone.
void barrier_dissemination(const Context& ctx) {
  transport::Transport& t = ctx.transport;
  for (int dist = 1; dist < ctx.size; dist <<= 1) {
    t.isend(mod(ctx.rank + dist, ctx.size), nullptr, 0);
    t.wait(t.irecv(mod(ctx.rank - dist, ctx.size), nullptr, 0));
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
