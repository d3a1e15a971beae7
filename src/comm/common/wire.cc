#include "comm/common/wire.h"

#include <cstring>

namespace chorus::wire {

void Writer::u32_at(size_t offset, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) out_[offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

bool Reader::u8(const char* field, uint8_t* v) {
  if (!need(1, field)) return false;
  *v = data_[pos_++];
  return true;
}

bool Reader::u16(const char* field, uint16_t* v) {
  if (!need(2, field)) return false;
  *v = static_cast<uint16_t>(get_le(data_.data() + pos_, 2));
  pos_ += 2;
  return true;
}

bool Reader::u32(const char* field, uint32_t* v) {
  if (!need(4, field)) return false;
  *v = static_cast<uint32_t>(get_le(data_.data() + pos_, 4));
  pos_ += 4;
  return true;
}

bool Reader::u64(const char* field, uint64_t* v) {
  if (!need(8, field)) return false;
  *v = get_le(data_.data() + pos_, 8);
  pos_ += 8;
  return true;
}

bool Reader::raw(const char* field, size_t size, uint8_t* out) {
  if (!need(size, field)) return false;
  if (size > 0) std::memcpy(out, data_.data() + pos_, size);
  pos_ += size;
  return true;
}

bool Reader::bytes(const char* field, size_t limit, std::vector<uint8_t>* out) {
  size_t size = 0;
  if (!length(field, limit, &size)) return false;
  out->assign(data_.begin() + pos_, data_.begin() + pos_ + size);
  pos_ += size;
  return true;
}

bool Reader::text(const char* field, size_t limit, std::string* out) {
  size_t size = 0;
  if (!length(field, limit, &size)) return false;
  out->assign(reinterpret_cast<const char*>(data_.data() + pos_), size);
  pos_ += size;
  return true;
}

bool Reader::count(const char* field, size_t limit, size_t min_item_bytes, uint32_t* out) {
  uint32_t declared = 0;
  if (!u32(field, &declared)) return false;
  if (declared > limit) {
    return fail(std::string(field) + " " + std::to_string(declared) + " exceeds the limit of " +
                std::to_string(limit));
  }
  if (uint64_t{declared} * min_item_bytes > left()) {
    return fail(std::string(field) + " " + std::to_string(declared) + " cannot fit in the " +
                std::to_string(left()) + " bytes left in the frame");
  }
  *out = declared;
  return true;
}

bool Reader::fail(const std::string& reason) {
  if (reason_.empty()) reason_ = reason;
  return false;
}

bool Reader::finish(std::string* reason) {
  if (reason_.empty() && left() != 0) {
    fail(std::to_string(left()) + " unexpected bytes after its last field");
  }
  if (reason_.empty()) return true;
  *reason = reason_;
  return false;
}

bool Reader::need(size_t n, const char* field) {
  if (!reason_.empty()) return false;
  if (n <= left()) return true;
  return fail(std::string(field) + " needs " + std::to_string(n) + " bytes but only " +
              std::to_string(left()) + " are left in the frame");
}

bool Reader::length(const char* field, size_t limit, size_t* size) {
  uint32_t declared = 0;
  if (!u32(field, &declared)) return false;
  if (declared > limit) {
    return fail(std::string(field) + " of " + std::to_string(declared) +
                " bytes exceeds the limit of " + std::to_string(limit));
  }
  if (declared > left()) {
    return fail(std::string(field) + " of " + std::to_string(declared) +
                " bytes runs past the end of the frame (" + std::to_string(left()) +
                " bytes left)");
  }
  *size = declared;
  return true;
}

}  // namespace chorus::wire
