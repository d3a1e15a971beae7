#include "comm/store/server_frames.h"

#include <sys/socket.h>

#include <span>


namespace chorus::store_server {

using store_wire::AuthKind;
using store_wire::AuthMessage;

Bytes hello_frame(const auth::Nonce& server_nonce) {
  AuthMessage hello;
  hello.kind = AuthKind::kServerHello;
  hello.nonce = server_nonce;
  return store_wire::encode_auth(hello);
}

void send_refusal(int fd, const std::string& reason) {
  AuthMessage refusal;
  refusal.kind = AuthKind::kRefused;
  refusal.message = reason;
  Bytes frame = store_wire::encode_auth(refusal);
  ssize_t ignored = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)ignored;
}

Take take_client_proof(Bytes& in, const handshake::Proofs& proofs,
                           const auth::Nonce& server_nonce, Bytes* out, std::string* refusal) {
  constexpr size_t kPrefix = store_wire::kLengthPrefixBytes;
  if (in.size() < kPrefix) return Take::kIncomplete;
  uint32_t length = store_wire::read_length_prefix(in.data());
  if (!store_wire::check_auth_frame_length(length, refusal)) return Take::kRefused;
  if (in.size() < kPrefix + length) return Take::kIncomplete;
  AuthMessage message;
  std::span<const uint8_t> payload(in.data() + kPrefix, length);
  if (!store_wire::decode_auth(payload, &message, refusal)) return Take::kRefused;
  if (message.kind != AuthKind::kClientProof) {
    *refusal = "expected CLIENT_PROOF, got authentication kind " +
               std::to_string(static_cast<int>(message.kind));
    return Take::kRefused;
  }
  if (message.version != store_wire::kAuthVersion) {
    *refusal = "authentication version differs (client " + std::to_string(message.version) +
               ", here " + std::to_string(store_wire::kAuthVersion) + ")";
    return Take::kRefused;
  }
  in.erase(in.begin(), in.begin() + kPrefix + length);
  handshake::Nonces nonces{message.nonce, server_nonce};
  if (!proofs.client_proved(nonces, message.proof)) {
    *refusal = auth::kTokenMismatch;
    return Take::kRefused;
  }
  AuthMessage answer;
  answer.kind = AuthKind::kServerProof;
  answer.proof = proofs.server(nonces);
  Bytes frame = store_wire::encode_auth(answer);
  out->insert(out->end(), frame.begin(), frame.end());
  return Take::kReady;
}

Take take_request(Bytes& in, store_wire::Request* request, std::string* reason) {
  constexpr size_t kPrefix = store_wire::kLengthPrefixBytes;
  if (in.size() < kPrefix) return Take::kIncomplete;
  uint32_t length = store_wire::read_length_prefix(in.data());
  if (!store_wire::check_frame_length(length, reason)) return Take::kRefused;
  if (in.size() < kPrefix + length) {
    in.reserve(kPrefix + length);  // length was checked above
    return Take::kIncomplete;
  }
  std::span<const uint8_t> payload(in.data() + kPrefix, length);
  if (!store_wire::decode_request(payload, request, reason)) return Take::kRefused;
  in.erase(in.begin(), in.begin() + kPrefix + length);
  return Take::kReady;
}

}  // namespace chorus::store_server
