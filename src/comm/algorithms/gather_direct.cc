#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// The root posts a receive from every rank at once; the streams proceed together.
void gather_direct(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const size_t bytes = count * ctx.elem;
  transport::Transport& t = ctx.transport;
  if (ctx.rank != root) {
    t.wait(t.isend(root, in, bytes));
    return;
  }
  auto* dst = static_cast<uint8_t*>(out);
  for (int r = 0; r < ctx.size; ++r) {
    uint8_t* block = dst + static_cast<size_t>(r) * bytes;
    if (r != root) t.irecv(r, block, bytes);
    else if (block != in && bytes > 0) std::memmove(block, in, bytes);
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
