// The byte codec of every chorus wire format (the store's frames, the connection
// handshake, the authentication transcript): little-endian fixed-width integers,
// length-prefixed strings and byte strings (a u32 length, then the bytes), and fixed
// arrays.
//
// Reader never trusts a number it reads: every length and count is checked against
// its limit and against the bytes left before anything is allocated or copied. The
// first failure records a reason naming the field ("key of 5000 bytes exceeds the
// limit of 4096") and makes every later read fail too, so that a decoder may read all
// its fields and look at the outcome once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::wire {

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

// Appends fields to a byte buffer.
class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { put_le(out_, v, 2); }
  void u32(uint32_t v) { put_le(out_, v, 4); }
  void u64(uint64_t v) { put_le(out_, v, 8); }
  void raw(const uint8_t* data, size_t size) { out_.insert(out_.end(), data, data + size); }
  template <size_t N>
  void array(const std::array<uint8_t, N>& a) {
    raw(a.data(), N);
  }
  // A u32 length and the bytes. A size beyond u32 keeps a truncated length: callers
  // bound what they send first.
  void bytes(const uint8_t* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    raw(data, size);
  }
  void bytes(const std::vector<uint8_t>& b) { bytes(b.data(), b.size()); }
  void text(std::string_view s) { bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  // Overwrites the u32 at `offset` (a length written before what it counts).
  void u32_at(size_t offset, uint32_t v);

  size_t size() const { return out_.size(); }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields from one message, never past its end. Each read returns false once any
// read failed.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> data) : data_(data) {}

  bool u8(const char* field, uint8_t* v);
  bool u16(const char* field, uint16_t* v);
  bool u32(const char* field, uint32_t* v);
  bool u64(const char* field, uint64_t* v);
  bool raw(const char* field, size_t size, uint8_t* out);
  template <size_t N>
  bool array(const char* field, std::array<uint8_t, N>* out) {
    return raw(field, N, out->data());
  }
  // A u32 length of at most `limit`, then that many bytes.
  bool bytes(const char* field, size_t limit, std::vector<uint8_t>* out);
  bool text(const char* field, size_t limit, std::string* out);
  // A u32 count of at most `limit` items, each of which takes at least `min_item_bytes`
  // (> 0) of what is left: a count the message cannot hold is refused before the caller
  // sizes anything by it.
  bool count(const char* field, size_t limit, size_t min_item_bytes, uint32_t* out);

  // Records `reason` unless a reason is recorded already; returns false.
  bool fail(const std::string& reason);
  // True when every read succeeded and nothing is left; else false with the reason
  // ("3 unexpected bytes after its last field" when bytes are left over).
  bool finish(std::string* reason);
  size_t left() const { return data_.size() - pos_; }

 private:
  bool need(size_t n, const char* field);
  bool length(const char* field, size_t limit, size_t* size);

  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  std::string reason_;
};

}  // namespace chorus::wire
