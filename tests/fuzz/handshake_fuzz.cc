// libFuzzer target: the TCP data connection's handshake messages
// (src/comm/transport/tcp/handshake.h, the common flow of comm/common/handshake.h in
// this protocol's frames). The first byte picks the decoder (hello, challenge, proof,
// verdict: ACCEPTED or REFUSED, or any message: its header, then the whole of it); the
// rest is the message. A message is either refused with a reason or decoded; a decoded
// one must encode to bytes that decode again and encode to the same bytes. A decoded
// HELLO also goes through the acceptor's field checks, and any decoded message through
// the server's side of the flow. Seeds: write_seeds.cc.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/transport/tcp/handshake.h"

namespace tcp = chorus::transport::tcp;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "handshake_fuzz: %s\n", what);
  std::abort();
}

// decode -> encode -> decode -> encode must reach a fixed point after one step.
template <typename Message, typename Decode, typename Encode>
void round_trip(std::span<const uint8_t> bytes, Decode decode, Encode encode,
                void (*also)(const Message&) = nullptr) {
  Message first;
  std::string reason;
  if (!decode(bytes, &first, &reason)) {
    if (reason.empty()) fail("message refused without a reason");
    return;
  }
  if (also) also(first);
  std::vector<uint8_t> encoded = encode(first);
  Message second;
  if (!decode(std::span<const uint8_t>(encoded), &second, &reason)) fail("re-encoded message refused");
  if (encode(second) != encoded) fail("message does not survive encode/decode");
}

void check_fields(const tcp::Hello& hello) {
  tcp::Expected expected{0, 4, "fuzz", "token"};
  std::optional<std::string> refusal = tcp::check_hello(hello, expected);
  if (refusal && refusal->empty()) fail("hello refused without a reason");
}

// The server's side of the flow, with this protocol's HELLO hook, answers any message.
void through_the_server(const chorus::handshake::Message& message) {
  chorus::handshake::Server server("token");
  tcp::Expected expected{0, 4, "fuzz", "token"};
  auto check = [&](std::span<const uint8_t> fields, std::string* context, std::string* why) {
    tcp::Hello hello;
    if (!tcp::decode_hello_fields(fields, &hello, why)) return false;
    if (auto mismatch = tcp::check_hello(hello, expected)) {
      *why = *mismatch;
      return false;
    }
    *context = tcp::proof_context(hello.comm_id, hello.from_rank, hello.to_rank, hello.size);
    return true;
  };
  std::optional<chorus::handshake::Message> answer = server.take(message, check);
  if (!answer) fail("the server gave no answer to a first message");
  if (answer->kind == chorus::handshake::Kind::kRefused && server.refusal().empty()) {
    fail("the server refused without a reason");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> message(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      round_trip<tcp::Hello>(message, tcp::decode_hello, tcp::encode_hello, check_fields);
      break;
    case 1:
      round_trip<tcp::Challenge>(message, tcp::decode_challenge, tcp::encode_challenge);
      break;
    case 2:
      round_trip<tcp::ProofMessage>(message, tcp::decode_proof, tcp::encode_proof);
      break;
    case 3:
      round_trip<tcp::Verdict>(message, tcp::decode_verdict, tcp::encode_verdict);
      break;
    default: {
      if (message.size() < tcp::kHeaderBytes) return 0;
      tcp::MessageKind kind;
      uint32_t length = 0;
      std::string reason;
      if (tcp::decode_header(message.first(tcp::kHeaderBytes), &kind, &length, &reason)) {
        if (length > tcp::kMaxPayload) fail("header accepted a payload over the limit");
      } else if (reason.empty()) {
        fail("header refused without a reason");
      }
      round_trip<chorus::handshake::Message>(message, tcp::decode_message, tcp::encode_message,
                                             through_the_server);
    }
  }
  return 0;
}
