#include "comm/reduce/validate.h"

#include <cstdint>
#include <limits>

#include "chorus/error.h"

namespace chorus::reduce {

constexpr size_t kMaxBytes = size_t{1} << 62;

void Validator::fail(const std::string& message) const {
  throw InvalidArgumentError(std::string(op_) + " on rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + ": " + message);
}

size_t Validator::bytes(size_t count, DataType dtype, const char* what) const {
  size_t elem = dtype_size(dtype);
  if (elem == 0) fail(std::string("unknown data type for ") + what);
  if (count > kMaxBytes / elem) {
    // Said in bytes against the limit: 2^60 float64 elements are 2^63 bytes, which a
    // size_t holds; only beyond 2^64 does the product itself overflow.
    const unsigned __int128 total = static_cast<unsigned __int128>(count) * elem;
    std::string size;
    if (total >> 64) {
      size = "more than 2^64 bytes";
    } else {
      const uint64_t b = static_cast<uint64_t>(total);
      size = (b & (b - 1)) == 0 ? "2^" + std::to_string(__builtin_ctzll(b)) + " bytes"
                                : std::to_string(b) + " bytes";
    }
    fail(std::string(what) + " of " + std::to_string(count) + " elements of " +
         dtype_name(dtype) + " is " + size + ", above the limit of 2^62 bytes per buffer");
  }
  return count * elem;
}

size_t Validator::blocks_bytes(size_t count, DataType dtype, const char* what) const {
  bytes(count, dtype, what);
  const std::string blocks = std::string(what) + " * size";
  if (count > SIZE_MAX / static_cast<size_t>(size_)) fail(blocks + " overflows");
  return bytes(count * static_cast<size_t>(size_), dtype, blocks.c_str());
}

void Validator::buffer(const void* p, size_t count, const char* what) const {
  if (p == nullptr && count > 0) {
    fail(std::string(what) + " buffer is null but count is " + std::to_string(count));
  }
}

void Validator::root(int root) const {
  if (root < 0 || root >= size_) {
    fail("root " + std::to_string(root) + " is out of range [0, " + std::to_string(size_) + ")");
  }
}

void Validator::peer(int peer) const {
  if (peer < 0 || peer >= size_) {
    fail("peer " + std::to_string(peer) + " is out of range [0, " + std::to_string(size_) + ")");
  }
  if (peer == rank_) fail("peer " + std::to_string(peer) + " is this rank itself");
}

void Validator::counts(std::span<const size_t> counts, const char* what) const {
  if (counts.size() != static_cast<size_t>(size_)) {
    fail(std::string(what) + " has " + std::to_string(counts.size()) + " entries, expected " +
         std::to_string(size_));
  }
}

void Validator::displs(std::span<const size_t> counts, std::span<const size_t> displs,
                       DataType dtype, const char* what) const {
  if (displs.empty()) return;
  this->counts(displs, what);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (displs[i] > kMaxBytes || counts[i] > kMaxBytes - displs[i]) {
      fail(std::string(what) + "[" + std::to_string(i) + "] + count overflows");
    }
    bytes(displs[i] + counts[i], dtype, what);
  }
}

size_t Validator::extent(std::span<const size_t> counts, std::span<const size_t> displs) const {
  size_t end = 0, packed = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    size_t start = displs.empty() ? packed : displs[i];
    if (counts[i] > kMaxBytes - start) fail("block " + std::to_string(i) + " overflows");
    end = std::max(end, start + counts[i]);
    packed = start + counts[i];
  }
  return end;
}

}  // namespace chorus::reduce
