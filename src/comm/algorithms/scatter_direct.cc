#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace chorus::algorithms {

// The root posts a send to every rank at once; the streams proceed together.
void scatter_direct(const Context& ctx, const void* in, void* out, size_t count, int root) {
  const size_t bytes = count * ctx.elem;
  transport::Transport& t = ctx.transport;
  if (ctx.rank != root) {
    t.wait(t.irecv(root, out, bytes));
    return;
  }
  auto* src = static_cast<const uint8_t*>(in);
  for (int r = 0; r < ctx.size; ++r) {
    const uint8_t* block = src + static_cast<size_t>(r) * bytes;
    if (r != root) t.isend(r, block, bytes);
    else if (block != out && bytes > 0) std::memmove(out, block, bytes);
  }
  t.wait_all();
}

}  // namespace chorus::algorithms
