#include "comm/store/server_frames.h"

#include <sys/socket.h>

#include <span>

namespace chorus::store::server {

void send_refusal(int fd, const std::string& reason) {
  Bytes frame = store::wire::encode_auth(handshake::refused(reason));
  ssize_t ignored = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
}

Take take_auth(Bytes& in, handshake::Message* message, std::string* refusal) {
  constexpr size_t kPrefix = store::wire::kLengthPrefixBytes;
  if (in.size() < kPrefix) return Take::kIncomplete;
  uint32_t length = store::wire::read_length_prefix(in.data());
  if (!store::wire::check_auth_frame_length(length, refusal)) return Take::kRefused;
  if (in.size() < kPrefix + length) return Take::kIncomplete;
  std::span<const uint8_t> payload(in.data() + kPrefix, length);
  if (!store::wire::decode_auth(payload, message, refusal)) return Take::kRefused;
  in.erase(in.begin(), in.begin() + kPrefix + length);
  return Take::kReady;
}

Take take_request(Bytes& in, store::wire::Request* request, std::string* reason) {
  constexpr size_t kPrefix = store::wire::kLengthPrefixBytes;
  if (in.size() < kPrefix) return Take::kIncomplete;
  uint32_t length = store::wire::read_length_prefix(in.data());
  if (!store::wire::check_frame_length(length, reason)) return Take::kRefused;
  if (in.size() < kPrefix + length) {
    in.reserve(kPrefix + length);  // length was checked above
    return Take::kIncomplete;
  }
  std::span<const uint8_t> payload(in.data() + kPrefix, length);
  if (!store::wire::decode_request(payload, request, reason)) return Take::kRefused;
  in.erase(in.begin(), in.begin() + kPrefix + length);
  return Take::kReady;
}

}  // namespace chorus::store::server
