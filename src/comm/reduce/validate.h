// Argument checks made by the issuing calls, before anything is queued or sent.
// Each throws InvalidArgumentError naming the operation, the rank and the argument.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "chorus/types.h"

namespace chorus::reduce {

class Validator {
 public:
  Validator(Collective op, int rank, int size)
      : op_(collective_name(op)), rank_(rank), size_(size) {}

  // count * element size, or an error when it overflows or exceeds 2^62 bytes.
  size_t bytes(size_t count, DataType dtype, const char* what) const;
  // One block of `count` elements per rank, count * size in bytes: the errors of
  // bytes() for `what` and for "<what> * size", or when count * size overflows.
  size_t blocks_bytes(size_t count, DataType dtype, const char* what) const;
  void buffer(const void* p, size_t count, const char* what) const;
  void root(int root) const;
  void peer(int peer) const;
  void counts(std::span<const size_t> counts, const char* what) const;
  // Every block [displs[i], displs[i]+counts[i]) stays below 2^62 bytes.
  void displs(std::span<const size_t> counts, std::span<const size_t> displs, DataType dtype,
              const char* what) const;
  // Largest end of a block, in elements.
  size_t extent(std::span<const size_t> counts, std::span<const size_t> displs) const;
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const char* op_;
  int rank_, size_;
};

}  // namespace chorus::reduce
