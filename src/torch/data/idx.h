// IDX files (the MNIST family's format): a 4-byte magic (0, 0, type, number of
// dimensions), one big-endian uint32 per dimension, then the payload. Only the
// unsigned-byte type (0x08) is read; that is all MNIST and Fashion-MNIST use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // the payload, product(dims) bytes, row-major
};

// Reads `path`, gzipped or raw (told apart by content, not by name), and checks
// it is a ubyte array of `num_dims` dimensions whose payload is exactly
// product(dims) bytes. The payload buffer is only allocated once the header is
// known to fit the file's size. Throws DataError naming the file and the problem.
IdxArray read_idx(const std::string& path, int num_dims);

// Returns directory/name if it exists, else directory/name.gz if that exists.
// Throws DataError naming both candidates when neither does.
std::string find_idx_file(const std::string& directory, const std::string& name);

}  // namespace chorus::data
