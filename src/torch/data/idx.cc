#include "idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>

#include "chorus/torch/data.h"

namespace chorus::data {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
// Deflate cannot expand data by more than 1032:1 (zlib's FAQ), so a gzip file
// of F bytes never holds more than F * 1032 bytes: the bound for allocations.
constexpr int64_t kMaxDeflateRatio = 1032;

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// An open IDX file being read, raw or gzip; zlib reads both through gzread.
struct Reader {
  std::string path;
  GzFile file;
  int64_t file_size = 0;

  bool is_gzip() { return gzdirect(file.get()) == 0; }
  const char* format() { return is_gzip() ? "gzip" : "raw"; }
};

Reader open_reader(const std::string& path) {
  std::error_code error;
  auto size = std::filesystem::file_size(path, error);
  if (error) throw DataError(path, "cannot open: " + error.message());
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(file.get(), 1 << 17);  // before the first read, as zlib requires
  return Reader{path, std::move(file), static_cast<int64_t>(size)};
}

// Reads up to `count` bytes; returns how many arrived before the end of the
// data. A zlib error (bad gzip data, a checksum mismatch, a cut-off stream)
// becomes a DataError.
int64_t read_bytes(Reader& reader, uint8_t* out, int64_t count) {
  int64_t got = 0;
  while (got < count) {
    auto chunk = static_cast<unsigned>(std::min<int64_t>(count - got, INT_MAX / 2));
    int n = gzread(reader.file.get(), out + got, chunk);
    if (n <= 0) break;
    got += n;
  }
  int errnum = Z_OK;
  std::string message = gzerror(reader.file.get(), &errnum);
  if (errnum == Z_OK) return got;
  if (errnum == Z_ERRNO) throw DataError(reader.path, "read failed: " + message);
  if (errnum == Z_BUF_ERROR) {
    throw DataError(reader.path, "truncated gzip stream (zlib: " + message + ")");
  }
  throw DataError(reader.path, "corrupt gzip: " + message);
}

void read_exactly(Reader& reader, uint8_t* out, int64_t count, const char* what) {
  int64_t got = read_bytes(reader, out, count);
  if (got != count) {
    throw DataError(reader.path, std::string("truncated ") + reader.format() + " file: expected " +
                                     std::to_string(count) + " bytes of " + what + ", got " +
                                     std::to_string(got));
  }
}

uint32_t big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

void check_magic(Reader& reader, int num_dims) {
  uint8_t magic[4];
  read_exactly(reader, magic, 4, "magic number");
  uint32_t expected = (uint32_t{kUnsignedByteType} << 8) | static_cast<uint32_t>(num_dims);
  uint32_t actual = big_endian_u32(magic);
  if (actual != expected) {
    throw DataError(reader.path, "wrong magic number " + std::to_string(actual) + ", expected " +
                                     std::to_string(expected) + " (ubyte, " +
                                     std::to_string(num_dims) + " dimensions; read as " +
                                     reader.format() + ")");
  }
}

std::vector<int64_t> read_dims(Reader& reader, int num_dims) {
  std::vector<uint8_t> raw(4 * static_cast<size_t>(num_dims));
  read_exactly(reader, raw.data(), static_cast<int64_t>(raw.size()), "dimensions");
  std::vector<int64_t> dims;
  for (int i = 0; i < num_dims; ++i) dims.push_back(big_endian_u32(&raw[4 * i]));
  return dims;
}

// The payload size the header promises, checked against what the file can
// hold, so that a corrupt header never drives a huge allocation.
int64_t checked_payload_size(Reader& reader, const std::vector<int64_t>& dims) {
  int64_t payload = 1;
  for (int64_t dim : dims) {
    if (__builtin_mul_overflow(payload, dim, &payload)) {
      throw DataError(reader.path, "dimensions overflow a 64-bit size");
    }
  }
  int64_t header = 4 + 4 * static_cast<int64_t>(dims.size());
  int64_t limit =
      reader.is_gzip() ? reader.file_size * kMaxDeflateRatio : reader.file_size - header;
  if (payload > limit) {
    throw DataError(reader.path, std::string("truncated ") + reader.format() +
                                     " file: the header promises " + std::to_string(payload) +
                                     " payload bytes, but a file of " +
                                     std::to_string(reader.file_size) + " bytes holds at most " +
                                     std::to_string(limit));
  }
  return payload;
}

void check_at_end(Reader& reader, int64_t payload) {
  uint8_t extra;
  // Reading past the payload also makes zlib check the gzip trailer (CRC-32).
  if (read_bytes(reader, &extra, 1) != 0) {
    throw DataError(reader.path, "too long: more than the " + std::to_string(payload) +
                                     " payload bytes the header promises");
  }
}

}  // namespace

IdxArray read_idx(const std::string& path, int num_dims) {
  Reader reader = open_reader(path);
  check_magic(reader, num_dims);
  IdxArray array;
  array.dims = read_dims(reader, num_dims);
  int64_t payload = checked_payload_size(reader, array.dims);
  array.bytes.resize(static_cast<size_t>(payload));
  read_exactly(reader, array.bytes.data(), payload, "payload");
  check_at_end(reader, payload);
  return array;
}

std::string find_idx_file(const std::string& directory, const std::string& name) {
  std::filesystem::path raw = std::filesystem::path(directory) / name;
  std::filesystem::path gz = raw;
  gz += ".gz";
  std::error_code ignored;  // an unreadable directory reads as "missing" below
  if (std::filesystem::exists(raw, ignored)) return raw.string();
  if (std::filesystem::exists(gz, ignored)) return gz.string();
  throw DataError(raw.string(),
                  "missing: neither " + raw.string() + " nor " + gz.string() + " exists");
}

}  // namespace chorus::data
