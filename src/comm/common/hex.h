// Lower-case hexadecimal text of bytes: escaped key bytes in store messages, tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus::hex {

// Appends the two lower-case hex digits of `byte` to `out`.
inline void append_byte(std::string& out, uint8_t byte) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out += kDigits[byte >> 4];
  out += kDigits[byte & 15];
}

// The 2 * size lower-case hex digits of `data`.
inline std::string encode(const uint8_t* data, size_t size) {
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) append_byte(out, data[i]);
  return out;
}

}  // namespace chorus::hex
