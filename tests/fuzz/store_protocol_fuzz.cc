// libFuzzer target: the TCP store's wire decoding (src/comm/store/tcp_store_protocol.h).
// Any byte string is either refused with a reason or decoded; a decoded request or reply
// must encode back to a frame that decodes to the same thing. The first byte picks
// whether the rest is read as a request, a reply or an authentication message.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <span>
#include <string>

#include "comm/store/tcp_store_protocol.h"

namespace wire = chorus::store_wire;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "store_protocol_fuzz: %s\n", what);
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

// The payload of a whole frame, after checking its length prefix.
std::span<const uint8_t> payload_of(const chorus::Bytes& frame) {
  if (frame.size() < wire::kLengthPrefixBytes) fail("encoded frame shorter than its prefix");
  uint32_t length = wire::read_length_prefix(frame.data());
  if (length != frame.size() - wire::kLengthPrefixBytes) fail("length prefix disagrees");
  std::string reason;
  if (!wire::check_frame_length(length, &reason)) fail("re-encoded frame refused by its length");
  return std::span<const uint8_t>(frame).subspan(wire::kLengthPrefixBytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> payload(data + 1, size - 1);
  std::string reason;
  if (size >= 1 + wire::kLengthPrefixBytes) {
    // The length check must accept or refuse without trouble for any prefix.
    (void)wire::check_frame_length(wire::read_length_prefix(data + 1), &reason);
  }
  if (data[0] % 3 == 2) {
    wire::AuthMessage message;
    if (!wire::decode_auth(payload, &message, &reason)) {
      if (reason.empty()) fail("authentication message refused without a reason");
      return 0;
    }
    chorus::Bytes frame = wire::encode_auth(message);
    if (!wire::check_auth_frame_length(wire::read_length_prefix(frame.data()), &reason)) {
      fail("re-encoded authentication message refused by its length");
    }
    std::span<const uint8_t> again_payload = std::span<const uint8_t>(frame).subspan(wire::kLengthPrefixBytes);
    wire::AuthMessage again;
    if (!wire::decode_auth(again_payload, &again, &reason)) fail("re-encoded authentication message refused");
    if (wire::encode_auth(again) != frame) fail("authentication message does not survive encode/decode");
  } else if (data[0] % 3 == 1) {
    wire::Request request;
    if (!wire::decode_request(payload, &request, &reason)) {
      if (reason.empty()) fail("request refused without a reason");
      return 0;
    }
    chorus::Bytes frame = wire::encode_request(request);
    wire::Request again;
    if (!wire::decode_request(payload_of(frame), &again, &reason)) fail("re-encoded request refused");
    if (!same(request, again)) fail("request does not survive encode/decode");
  } else {
    wire::Reply reply;
    if (!wire::decode_reply(payload, &reply, &reason)) {
      if (reason.empty()) fail("reply refused without a reason");
      return 0;
    }
    chorus::Bytes frame = wire::encode_reply(reply);
    wire::Reply again;
    if (!wire::decode_reply(payload_of(frame), &again, &reason)) fail("re-encoded reply refused");
    if (!same(reply, again)) fail("reply does not survive encode/decode");
  }
  return 0;
}
