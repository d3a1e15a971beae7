// libFuzzer target: the TCP store's wire decoding (src/comm/store/tcp_store_protocol.h).
// Any byte string is either refused with a reason or decoded; a decoded request, reply
// or authentication message must encode back to a frame that decodes to the same thing.
// The first byte picks which of the three the rest is read as. A decoded
// authentication message is also handed to the server's side of the common handshake
// (comm/common/handshake.h, with the store's HELLO hook) and to a client's, each of
// which must answer it or refuse it with a reason. Seeds: write_seeds.cc.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <span>
#include <string>

#include "comm/common/handshake.h"
#include "comm/store/tcp_store_protocol.h"

namespace wire = chorus::store::wire;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "store_protocol_fuzz: %s\n", what.c_str());
  std::abort();
}

bool same(const wire::Request& a, const wire::Request& b) {
  return a.op == b.op && a.key == b.key && a.keys == b.keys && a.value == b.value &&
         a.expected == b.expected && a.delta == b.delta && a.timeout_ms == b.timeout_ms;
}

bool same(const wire::Reply& a, const wire::Reply& b) {
  return a.kind == b.kind && a.value == b.value && a.integer == b.integer && a.flag == b.flag &&
         a.missing_count == b.missing_count && a.keys == b.keys && a.message == b.message;
}

bool same(const chorus::handshake::Message& a, const chorus::handshake::Message& b) {
  return wire::encode_auth(a) == wire::encode_auth(b);
}

// The flow's two sides take any decoded message without trouble.
void through_the_flow(std::span<const uint8_t> payload) {
  namespace handshake = chorus::handshake;
  handshake::Message message;
  std::string reason;
  if (!wire::decode_auth(payload, &message, &reason)) return;
  handshake::Server server("token");
  std::optional<handshake::Message> answer = server.take(message, wire::check_hello_fields);
  if (!answer) fail("the server gave no answer to a first message");
  if (answer->kind == handshake::Kind::kRefused && server.refusal().empty()) {
    fail("the server refused without a reason");
  }
  if (answer->kind == handshake::Kind::kChallenge && message.kind != handshake::Kind::kHello) {
    fail("the server challenged something other than a HELLO");
  }
  handshake::Client client("token", wire::kAuthContext, chorus::auth::Nonce{});
  handshake::Client::Step step = client.take(message);
  if (step.outcome == handshake::Client::Outcome::kAccepted) {
    fail("a client accepted before it proved the token");
  }
}

// The payload of a whole frame, after checking its length prefix with `length_ok`
// (check_frame_length, or check_auth_frame_length for authentication frames).
std::span<const uint8_t> payload_of(const chorus::Bytes& frame,
                                    bool (*length_ok)(uint32_t, std::string*)) {
  if (frame.size() < wire::kLengthPrefixBytes) fail("encoded frame shorter than its prefix");
  uint32_t length = wire::read_length_prefix(frame.data());
  if (length != frame.size() - wire::kLengthPrefixBytes) fail("length prefix disagrees");
  std::string reason;
  if (!length_ok(length, &reason)) fail("re-encoded frame refused by its length");
  return std::span<const uint8_t>(frame).subspan(wire::kLengthPrefixBytes);
}

// Decodes `payload` as a `what`; when that succeeds, encodes it, checks the frame and
// decodes it again, which must give the same message.
template <class Message, class Decode, class Encode>
void round_trip(const std::string& what, std::span<const uint8_t> payload, Decode decode,
                Encode encode, bool (*length_ok)(uint32_t, std::string*)) {
  Message first;
  std::string reason;
  if (!decode(payload, &first, &reason)) {
    if (reason.empty()) fail(what + " refused without a reason");
    return;
  }
  chorus::Bytes frame = encode(first);
  Message again;
  if (!decode(payload_of(frame, length_ok), &again, &reason)) fail("re-encoded " + what + " refused");
  if (!same(first, again)) fail(what + " does not survive encode/decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> payload(data + 1, size - 1);
  if (size >= 1 + wire::kLengthPrefixBytes) {
    // The length check must accept or refuse without trouble for any prefix.
    std::string reason;
    (void)wire::check_frame_length(wire::read_length_prefix(data + 1), &reason);
  }
  switch (data[0] % 3) {
    case 2:
      round_trip<chorus::handshake::Message>("authentication message", payload,
                                             wire::decode_auth, wire::encode_auth,
                                             wire::check_auth_frame_length);
      through_the_flow(payload);
      break;
    case 1:
      round_trip<wire::Request>("request", payload, wire::decode_request, wire::encode_request,
                                wire::check_frame_length);
      break;
    default:
      round_trip<wire::Reply>("reply", payload, wire::decode_reply, wire::encode_reply,
                              wire::check_frame_length);
  }
  return 0;
}
