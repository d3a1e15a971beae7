// The first bytes on every TCP data connection. The connecting rank sends a Hello;
// the accepting rank checks every field and answers with a Reply. A mismatch is
// refused with a message that names the field, so a stray process, another job or
// another communicator can never be mistaken for a peer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "comm/common/deadline.h"

namespace chorus::transport::tcp {

inline constexpr uint32_t kHelloMagic = 0x43485253;  // "CHRS"
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kEndianCheck = 0x01020304;
inline constexpr size_t kMaxHelloString = 1024;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint32_t endian = kEndianCheck;
  int32_t from_rank = -1;
  int32_t to_rank = -1;
  int32_t size = 0;
  std::string comm_id;
  std::string token;
};

// What the acceptor expects to see.
struct Expected {
  int rank;  // the acceptor's own rank
  int size;
  std::string comm_id;
  std::string token;
};

// Writes a Hello on `fd` before the deadline.
void send_hello(int fd, const Hello& hello, const Deadline& deadline);
// Reads a Hello; throws PeerError for anything malformed (bounded lengths).
Hello read_hello(int fd, const Deadline& deadline);
// Empty when `hello` is acceptable; else the reason, naming the field.
std::optional<std::string> check_hello(const Hello& hello, const Expected& expected);
// Reply: empty `refusal` means accepted.
void send_reply(int fd, const std::string& refusal, const Deadline& deadline);
// Returns the refusal text, empty when accepted.
std::string read_reply(int fd, const Deadline& deadline);

}  // namespace chorus::transport::tcp
