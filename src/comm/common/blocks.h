// Ranges of `count` items split into `parts` nearly equal blocks (the first
// count % parts blocks get one more): the algorithms' blocks of elements
// (algorithms/context.h) and the ranks' shares of shared work (transport/shm).
#pragma once

#include <algorithm>
#include <cstddef>

namespace chorus {

inline size_t block_begin(size_t count, int parts, int block) {
  size_t base = count / parts, extra = count % parts;
  size_t b = static_cast<size_t>(block);
  return b * base + std::min(b, extra);
}
inline size_t block_count(size_t count, int parts, int block) {
  return count / parts + (static_cast<size_t>(block) < count % parts ? 1 : 0);
}

}  // namespace chorus
