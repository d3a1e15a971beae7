#include "comm/transport/tcp/handshake.h"

#include <cstring>
#include <vector>

#include "chorus/error.h"
#include "comm/common/socket.h"

namespace chorus::transport::tcp {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  out.insert(out.end(), b, b + 4);
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

uint32_t read_u32(int fd, const Deadline& d, const char* what) {
  uint32_t v;
  net::read_full(fd, &v, 4, d, std::string("handshake: reading ") + what);
  return v;
}

std::string read_string(int fd, const Deadline& d, const char* what) {
  uint32_t len = read_u32(fd, d, what);
  if (len > kMaxHelloString) {
    throw PeerError(std::string("handshake: ") + what + " of " + std::to_string(len) +
                    " bytes exceeds the limit of " + std::to_string(kMaxHelloString));
  }
  std::string s(len, '\0');
  net::read_full(fd, s.data(), len, d, std::string("handshake: reading ") + what);
  return s;
}

}  // namespace

void send_hello(int fd, const Hello& h, const Deadline& deadline) {
  std::vector<uint8_t> out;
  put_u32(out, h.magic);
  put_u32(out, h.version);
  put_u32(out, h.endian);
  put_u32(out, static_cast<uint32_t>(h.from_rank));
  put_u32(out, static_cast<uint32_t>(h.to_rank));
  put_u32(out, static_cast<uint32_t>(h.size));
  put_string(out, h.comm_id);
  put_string(out, h.token);
  net::write_full(fd, out.data(), out.size(), deadline, "handshake: sending hello");
}

Hello read_hello(int fd, const Deadline& d) {
  Hello h;
  h.magic = read_u32(fd, d, "magic");
  if (h.magic != kHelloMagic) {
    throw PeerError("handshake: not a chorus peer (bad magic number)");
  }
  h.version = read_u32(fd, d, "version");
  h.endian = read_u32(fd, d, "byte order");
  h.from_rank = static_cast<int32_t>(read_u32(fd, d, "rank"));
  h.to_rank = static_cast<int32_t>(read_u32(fd, d, "target rank"));
  h.size = static_cast<int32_t>(read_u32(fd, d, "size"));
  h.comm_id = read_string(fd, d, "communicator id");
  h.token = read_string(fd, d, "job token");
  return h;
}

std::optional<std::string> check_hello(const Hello& h, const Expected& e) {
  if (h.version != kProtocolVersion) {
    return "protocol version differs (peer " + std::to_string(h.version) + ", here " +
           std::to_string(kProtocolVersion) + ")";
  }
  if (h.endian != kEndianCheck) return "byte order differs";
  if (h.token != e.token) return "job token differs (CHORUS_JOB_TOKEN)";
  if (h.comm_id != e.comm_id) {
    return "communicator id differs (peer '" + h.comm_id + "', here '" + e.comm_id + "')";
  }
  if (h.size != e.size) {
    return "world size differs (peer " + std::to_string(h.size) + ", here " +
           std::to_string(e.size) + ")";
  }
  if (h.to_rank != e.rank) {
    return "target rank differs (peer wanted rank " + std::to_string(h.to_rank) +
           ", this is rank " + std::to_string(e.rank) + ")";
  }
  if (h.from_rank <= e.rank || h.from_rank >= e.size) {
    return "peer rank " + std::to_string(h.from_rank) + " is not a rank that connects to rank " +
           std::to_string(e.rank);
  }
  return std::nullopt;
}

void send_reply(int fd, const std::string& refusal, const Deadline& deadline) {
  std::vector<uint8_t> out;
  put_string(out, refusal.substr(0, kMaxHelloString));
  net::write_full(fd, out.data(), out.size(), deadline, "handshake: sending reply");
}

std::string read_reply(int fd, const Deadline& deadline) {
  return read_string(fd, deadline, "reply");
}

}  // namespace chorus::transport::tcp
