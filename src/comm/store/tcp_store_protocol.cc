#include "comm/store/tcp_store_protocol.h"

#include <utility>

#include "chorus/error.h"
#include "comm/common/handshake.h"
#include "comm/common/socket.h"
#include "comm/common/wire.h"

namespace chorus::store::wire {
namespace {

using chorus::wire::Reader;
using chorus::wire::Writer;

// A frame's writer, the length prefix still to fill in (finish_frame()).
Writer start_frame() {
  Writer w;
  w.u32(0);
  return w;
}

Bytes finish_frame(Writer& w) {
  // Oversized payloads keep a truncated prefix; senders check payload_size() first.
  w.u32_at(0, static_cast<uint32_t>(w.size() - kLengthPrefixBytes));
  return w.take();
}

void write_keys(Writer& w, const std::vector<std::string>& keys) {
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) w.text(k);
}

// Each key takes at least its 4-byte length, so a count the frame cannot hold is
// refused before the vector is sized by it.
bool read_keys(Reader& rd, size_t max_count, std::vector<std::string>* out) {
  uint32_t count = 0;
  if (!rd.count("key count", max_count, kLengthPrefixBytes, &count)) return false;
  out->resize(count);
  for (std::string& key : *out) {
    if (!rd.text("key", kMaxKeyBytes, &key)) return false;
  }
  return true;
}

// Succeeds when every read succeeded and the payload was consumed exactly; else the
// reason is "malformed <what>: <the field at fault>".
bool finish(Reader& rd, const std::string& what, std::string* reason) {
  std::string why;
  if (rd.finish(&why)) return true;
  *reason = "malformed " + what + ": " + why;
  return false;
}

void encode_request_fields(const Request& r, Writer& w) {
  switch (r.op) {
    case Op::kSet:
      w.text(r.key);
      w.bytes(r.value);
      break;
    case Op::kGet:
      w.text(r.key);
      w.u64(r.timeout_ms);
      break;
    case Op::kAdd:
      w.text(r.key);
      w.u64(static_cast<uint64_t>(r.delta));
      break;
    case Op::kCompareSet:
      w.text(r.key);
      w.bytes(r.expected);
      w.bytes(r.value);
      break;
    case Op::kCheck:
      write_keys(w, r.keys);
      break;
    case Op::kWait:
      write_keys(w, r.keys);
      w.u64(r.timeout_ms);
      break;
    case Op::kDelete:
      w.text(r.key);
      break;
    case Op::kNumKeys:
      break;
  }
}

bool decode_request_fields(Reader& rd, Request* r) {
  uint64_t delta = 0;
  switch (r->op) {
    case Op::kSet:
      return rd.text("key", kMaxKeyBytes, &r->key) && rd.bytes("value", kMaxValueBytes, &r->value);
    case Op::kGet:
      return rd.text("key", kMaxKeyBytes, &r->key) && rd.u64("timeout", &r->timeout_ms);
    case Op::kAdd:
      if (!rd.text("key", kMaxKeyBytes, &r->key) || !rd.u64("delta", &delta)) return false;
      r->delta = static_cast<int64_t>(delta);
      return true;
    case Op::kCompareSet:
      return rd.text("key", kMaxKeyBytes, &r->key) &&
             rd.bytes("expected value", kMaxValueBytes, &r->expected) &&
             rd.bytes("desired value", kMaxValueBytes, &r->value);
    case Op::kCheck:
      return read_keys(rd, kMaxKeysPerRequest, &r->keys);
    case Op::kWait:
      return read_keys(rd, kMaxKeysPerRequest, &r->keys) && rd.u64("timeout", &r->timeout_ms);
    case Op::kDelete:
      return rd.text("key", kMaxKeyBytes, &r->key);
    case Op::kNumKeys:
      return true;
  }
  return rd.fail("unknown opcode");
}

void encode_reply_fields(const Reply& r, Writer& w) {
  switch (r.kind) {
    case ReplyKind::kOk:
      break;
    case ReplyKind::kValue:
      w.bytes(r.value);
      break;
    case ReplyKind::kInteger:
      w.u64(static_cast<uint64_t>(r.integer));
      break;
    case ReplyKind::kBool:
      w.u8(r.flag ? 1 : 0);
      break;
    case ReplyKind::kTimeout:
      w.u32(r.missing_count);
      write_keys(w, r.keys);
      break;
    case ReplyKind::kInvalidArgument:
      w.text(r.message);
      break;
  }
}

bool decode_reply_fields(Reader& rd, Reply* r) {
  uint64_t integer = 0;
  uint8_t flag = 0;
  switch (r->kind) {
    case ReplyKind::kOk:
      return true;
    case ReplyKind::kValue:
      return rd.bytes("value", kMaxValueBytes, &r->value);
    case ReplyKind::kInteger:
      if (!rd.u64("integer", &integer)) return false;
      r->integer = static_cast<int64_t>(integer);
      return true;
    case ReplyKind::kBool:
      if (!rd.u8("flag", &flag)) return false;
      if (flag > 1) return rd.fail("flag byte " + std::to_string(flag) + " is neither 0 nor 1");
      r->flag = flag == 1;
      return true;
    case ReplyKind::kTimeout:
      return rd.u32("missing count", &r->missing_count) && read_keys(rd, kMaxListedKeys, &r->keys);
    case ReplyKind::kInvalidArgument:
      return rd.text("message", kMaxMessageBytes, &r->message);
  }
  return rd.fail("unknown reply kind");
}

bool valid_op(uint8_t code) { return code >= 1 && code <= static_cast<uint8_t>(Op::kNumKeys); }
bool valid_reply_kind(uint8_t code) {
  return code >= 1 && code <= static_cast<uint8_t>(ReplyKind::kInvalidArgument);
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compare_set";
    case Op::kCheck:
      return "check";
    case Op::kWait:
      return "wait";
    case Op::kDelete:
      return "delete_key";
    case Op::kNumKeys:
      return "num_keys";
  }
  return "unknown";
}

Bytes encode_request(const Request& request) {
  Writer w = start_frame();
  w.u8(static_cast<uint8_t>(request.op));
  encode_request_fields(request, w);
  return finish_frame(w);
}

Bytes encode_reply(const Reply& reply) {
  Writer w = start_frame();
  w.u8(static_cast<uint8_t>(reply.kind));
  encode_reply_fields(reply, w);
  return finish_frame(w);
}

size_t payload_size(const Bytes& frame) { return frame.size() - kLengthPrefixBytes; }

uint32_t read_length_prefix(const uint8_t* prefix) {
  return static_cast<uint32_t>(chorus::wire::get_le(prefix, kLengthPrefixBytes));
}

bool check_frame_length(uint32_t length, std::string* reason) {
  if (length == 0) {
    *reason = "empty frame (length 0, no opcode)";
    return false;
  }
  if (length > kMaxFrameBytes) {
    *reason = "frame length " + std::to_string(length) + " exceeds the limit of " +
              std::to_string(kMaxFrameBytes) + " bytes";
    return false;
  }
  return true;
}

bool decode_request(std::span<const uint8_t> payload, Request* out, std::string* reason) {
  Reader rd(payload);
  uint8_t code = 0;
  if (!rd.u8("opcode", &code)) return finish(rd, "request", reason);
  if (!valid_op(code)) {
    rd.fail("unknown opcode " + std::to_string(code));
    return finish(rd, "request", reason);
  }
  out->op = static_cast<Op>(code);
  decode_request_fields(rd, out);
  return finish(rd, std::string(op_name(out->op)) + " request", reason);
}

bool decode_reply(std::span<const uint8_t> payload, Reply* out, std::string* reason) {
  Reader rd(payload);
  uint8_t code = 0;
  if (!rd.u8("reply kind", &code)) return finish(rd, "reply", reason);
  if (!valid_reply_kind(code)) {
    rd.fail("unknown reply kind " + std::to_string(code));
    return finish(rd, "reply", reason);
  }
  out->kind = static_cast<ReplyKind>(code);
  decode_reply_fields(rd, out);
  return finish(rd, "reply", reason);
}

namespace {

// The common flow's kinds and their codes on this wire.
constexpr std::pair<handshake::Kind, AuthKind> kAuthKinds[] = {
    {handshake::Kind::kHello, AuthKind::kHello},
    {handshake::Kind::kChallenge, AuthKind::kChallenge},
    {handshake::Kind::kProof, AuthKind::kProof},
    {handshake::Kind::kAccepted, AuthKind::kAccepted},
    {handshake::Kind::kRefused, AuthKind::kRefused},
};

uint8_t code_of(handshake::Kind kind) {
  for (auto [k, code] : kAuthKinds) {
    if (k == kind) return static_cast<uint8_t>(code);
  }
  return 0;
}

// Version 1's own kinds (its REFUSED is this version's).
const char* version1_kind(uint8_t code) {
  switch (code) {
    case 0xA1:
      return "SERVER_HELLO";
    case 0xA2:
      return "CLIENT_PROOF";
    case 0xA3:
      return "SERVER_PROOF";
  }
  return nullptr;
}

}  // namespace

Bytes encode_auth(const handshake::Message& m) {
  Writer w = start_frame();
  w.u8(code_of(m.kind));
  handshake::encode_body(m, w);
  return finish_frame(w);
}

bool check_auth_frame_length(uint32_t length, std::string* reason) {
  if (length == 0) {
    *reason = "empty frame (length 0) where the authentication was expected";
    return false;
  }
  if (length > kMaxAuthFrameBytes) {
    *reason = "frame length " + std::to_string(length) +
              " exceeds the limit of an authentication frame (" +
              std::to_string(kMaxAuthFrameBytes) + " bytes)";
    return false;
  }
  return true;
}

bool decode_auth(std::span<const uint8_t> payload, handshake::Message* out,
                 std::string* reason) {
  Reader rd(payload);
  uint8_t code = 0;
  if (!rd.u8("authentication kind", &code)) return finish(rd, "authentication", reason);
  for (auto [kind, wire_code] : kAuthKinds) {
    if (code != static_cast<uint8_t>(wire_code)) continue;
    handshake::decode_body(kind, rd, out);
    return finish(rd, handshake::kind_name(kind), reason);
  }
  if (const char* old = version1_kind(code)) {
    rd.fail("got a " + std::string(old) + " of authentication version 1 (a chorus of another "
            "version; here " + std::to_string(kAuthVersion) + ")");
  } else if (valid_op(code)) {
    rd.fail("got a " + std::string(op_name(static_cast<Op>(code))) +
            " request before the authentication (a client without the job token "
            "handshake: an older chorus, or not chorus)");
  } else {
    rd.fail("unknown authentication kind " + std::to_string(code));
  }
  return finish(rd, "authentication", reason);
}

handshake::Message hello_message(const auth::Nonce& client_nonce, uint32_t version) {
  handshake::Message m;
  m.kind = handshake::Kind::kHello;
  Writer w;
  w.u32(version);
  m.fields = w.take();
  m.nonce = client_nonce;
  return m;
}

bool check_hello_fields(std::span<const uint8_t> fields, std::string* context,
                        std::string* refusal) {
  Reader rd(fields);
  uint32_t version = 0;
  rd.u32("auth version", &version);
  if (!finish(rd, "HELLO", refusal)) return false;
  if (version != kAuthVersion) {
    *refusal = "authentication version differs (client " + std::to_string(version) + ", here " +
               std::to_string(kAuthVersion) + ")";
    return false;
  }
  *context = kAuthContext;
  return true;
}

namespace {

handshake::Message read_auth(int fd, const Deadline& deadline, const std::string& where,
                             const std::string& step) {
  std::string what = where + ": authentication, " + step;
  uint8_t prefix[kLengthPrefixBytes];
  net::read_full(fd, prefix, sizeof prefix, deadline, what);
  uint32_t length = read_length_prefix(prefix);
  std::string reason;
  if (!check_auth_frame_length(length, &reason)) {
    throw StoreError(what + ": " + reason + " (not a chorus store of this version?)");
  }
  Bytes payload(length);  // length was checked above
  net::read_full(fd, payload.data(), payload.size(), deadline, what);
  handshake::Message message;
  if (!decode_auth(payload, &message, &reason)) {
    throw StoreError(what + ": " + reason + " (not a chorus store of this version?)");
  }
  return message;
}

}  // namespace

void authenticate_client(int fd, const std::string& token, const Deadline& deadline,
                         const std::string& where) {
  handshake::Client client(token, kAuthContext, auth::make_nonce());
  bool challenged = false;
  auto send = [&](const handshake::Message& m) {
    Bytes frame = encode_auth(m);
    net::write_full(fd, frame.data(), frame.size(), deadline,
                    where + (m.kind == handshake::Kind::kHello
                                 ? ": authentication, sending the hello"
                                 : ": authentication, sending the proof of the job token"));
  };
  auto receive = [&] {
    handshake::Message m =
        read_auth(fd, deadline, where,
                  challenged ? "waiting for the server's proof" : "waiting for the server's challenge");
    challenged = true;
    return m;
  };
  handshake::Client::Step step;
  try {
    Bytes fields = hello_message(auth::Nonce{}).fields;
    step = handshake::run_client(client, fields, send, receive);
  } catch (const PeerError& e) {
    throw StoreError(where + " closed the connection during the authentication (" + e.what() +
                     ")");
  }
  switch (step.outcome) {
    case handshake::Client::Outcome::kAccepted:
      return;
    case handshake::Client::Outcome::kRefused:
      throw StoreError(where + " refused this process: " + step.why);
    case handshake::Client::Outcome::kUnproven:
      throw StoreError(handshake::server_unproven(where, "this job's token",
                                                  "is it the store of another job?"));
    default:
      throw StoreError(where + ": authentication: " + step.why +
                       " (not a chorus store of this version?)");
  }
}

}  // namespace chorus::store::wire
