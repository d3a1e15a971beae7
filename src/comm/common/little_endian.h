// Little-endian integers in byte buffers: the byte order of every chorus wire format
// (the store's frames, the data-connection handshake, the authentication transcript).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus::wire_bytes {

// Appends the low `width` bytes of `v`, least significant first.
inline void put_le(std::vector<uint8_t>& out, uint64_t v, size_t width) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The `width`-byte little-endian integer at `p`.
inline uint64_t get_le(const uint8_t* p, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace chorus::wire_bytes
