#include "comm/store/tcp_store_protocol.h"

#include <algorithm>
#include <cstring>

#include "chorus/error.h"
#include "comm/common/little_endian.h"
#include "comm/common/socket.h"

namespace chorus::store_wire {
namespace {

// Appends little-endian fields to a frame whose length prefix is patched at the end.
class Writer {
 public:
  Writer() { out_.resize(kLengthPrefixBytes); }

  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v) { little_endian(v, 4); }
  void u64(uint64_t v) { little_endian(v, 8); }
  void bytes(const uint8_t* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    out_.insert(out_.end(), data, data + size);
  }
  void bytes(const Bytes& b) { bytes(b.data(), b.size()); }
  void text(const std::string& s) { bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  void raw(const uint8_t* data, size_t size) { out_.insert(out_.end(), data, data + size); }
  void keys(const std::vector<std::string>& keys) {
    u32(static_cast<uint32_t>(keys.size()));
    for (const std::string& k : keys) text(k);
  }

  Bytes finish() {
    // Oversized payloads keep a truncated prefix; senders check payload_size() first.
    uint64_t payload = out_.size() - kLengthPrefixBytes;
    for (size_t i = 0; i < kLengthPrefixBytes; ++i)
      out_[i] = static_cast<uint8_t>(payload >> (8 * i));
    return std::move(out_);
  }

 private:
  void little_endian(uint64_t v, int width) { wire_bytes::put_le(out_, v, width); }
  Bytes out_;
};

// Reads fields from one payload. Every length is checked against its limit and the
// bytes left before any allocation; the first failure records its reason and makes
// every later read fail too.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> payload) : data_(payload) {}

  bool u8(const char* field, uint8_t* v) {
    if (!need(1, field)) return false;
    *v = data_[pos_++];
    return true;
  }
  bool u32(const char* field, uint32_t* v) {
    uint64_t wide = 0;
    if (!little_endian(4, field, &wide)) return false;
    *v = static_cast<uint32_t>(wide);
    return true;
  }
  bool u64(const char* field, uint64_t* v) { return little_endian(8, field, v); }
  bool raw(const char* field, size_t size, uint8_t* out) {
    if (!need(size, field)) return false;
    std::memcpy(out, data_.data() + pos_, size);
    pos_ += size;
    return true;
  }

  bool bytes(const char* field, size_t limit, Bytes* out) {
    size_t size = 0;
    if (!length(field, limit, &size)) return false;
    out->assign(data_.begin() + pos_, data_.begin() + pos_ + size);
    pos_ += size;
    return true;
  }
  bool text(const char* field, size_t limit, std::string* out) {
    size_t size = 0;
    if (!length(field, limit, &size)) return false;
    out->assign(reinterpret_cast<const char*>(data_.data() + pos_), size);
    pos_ += size;
    return true;
  }
  bool keys(size_t max_count, std::vector<std::string>* out) {
    uint32_t count = 0;
    if (!u32("key count", &count)) return false;
    if (count > max_count) {
      return fail("key count " + std::to_string(count) + " exceeds the limit of " +
                  std::to_string(max_count));
    }
    // Each key takes at least its 4-byte length, so a count the frame cannot hold is
    // refused before the vector is sized by it.
    if (uint64_t{count} * 4 > left()) {
      return fail("key count " + std::to_string(count) + " cannot fit in the " +
                  std::to_string(left()) + " bytes left in the frame");
    }
    out->resize(count);
    for (std::string& key : *out) {
      if (!text("key", kMaxKeyBytes, &key)) return false;
    }
    return true;
  }

  // Succeeds when every read succeeded and the payload was consumed exactly.
  bool finish(const std::string& what, std::string* reason) {
    if (reason_.empty() && left() != 0) {
      fail(std::to_string(left()) + " unexpected bytes after the fields");
    }
    if (reason_.empty()) return true;
    *reason = "malformed " + what + ": " + reason_;
    return false;
  }
  bool fail(const std::string& reason) {
    if (reason_.empty()) reason_ = reason;
    return false;
  }

 private:
  size_t left() const { return data_.size() - pos_; }
  bool need(size_t n, const char* field) {
    if (!reason_.empty()) return false;
    if (n <= left()) return true;
    return fail(std::string(field) + " needs " + std::to_string(n) + " bytes but only " +
                std::to_string(left()) + " are left in the frame");
  }
  bool little_endian(size_t width, const char* field, uint64_t* v) {
    if (!need(width, field)) return false;
    *v = wire_bytes::get_le(data_.data() + pos_, width);
    pos_ += width;
    return true;
  }
  bool length(const char* field, size_t limit, size_t* size) {
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

  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  std::string reason_;
};

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
      w.keys(r.keys);
      break;
    case Op::kWait:
      w.keys(r.keys);
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
      return rd.keys(kMaxKeysPerRequest, &r->keys);
    case Op::kWait:
      return rd.keys(kMaxKeysPerRequest, &r->keys) && rd.u64("timeout", &r->timeout_ms);
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
      w.keys(r.keys);
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
      return rd.u32("missing count", &r->missing_count) && rd.keys(kMaxListedKeys, &r->keys);
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
  Writer w;
  w.u8(static_cast<uint8_t>(request.op));
  encode_request_fields(request, w);
  return w.finish();
}

Bytes encode_reply(const Reply& reply) {
  Writer w;
  w.u8(static_cast<uint8_t>(reply.kind));
  encode_reply_fields(reply, w);
  return w.finish();
}

size_t payload_size(const Bytes& frame) { return frame.size() - kLengthPrefixBytes; }

uint32_t read_length_prefix(const uint8_t* prefix) {
  return static_cast<uint32_t>(wire_bytes::get_le(prefix, kLengthPrefixBytes));
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
  if (!rd.u8("opcode", &code)) return rd.finish("request", reason);
  if (!valid_op(code)) {
    rd.fail("unknown opcode " + std::to_string(code));
    return rd.finish("request", reason);
  }
  out->op = static_cast<Op>(code);
  decode_request_fields(rd, out);
  return rd.finish(std::string(op_name(out->op)) + " request", reason);
}

bool decode_reply(std::span<const uint8_t> payload, Reply* out, std::string* reason) {
  Reader rd(payload);
  uint8_t code = 0;
  if (!rd.u8("reply kind", &code)) return rd.finish("reply", reason);
  if (!valid_reply_kind(code)) {
    rd.fail("unknown reply kind " + std::to_string(code));
    return rd.finish("reply", reason);
  }
  out->kind = static_cast<ReplyKind>(code);
  decode_reply_fields(rd, out);
  return rd.finish("reply", reason);
}

Bytes encode_auth(const AuthMessage& m) {
  Writer w;
  w.u8(static_cast<uint8_t>(m.kind));
  switch (m.kind) {
    case AuthKind::kServerHello:
      w.u32(m.version);
      w.raw(m.nonce.data(), m.nonce.size());
      break;
    case AuthKind::kClientProof:
      w.u32(m.version);
      w.raw(m.nonce.data(), m.nonce.size());
      w.raw(m.proof.data(), m.proof.size());
      break;
    case AuthKind::kServerProof:
      w.raw(m.proof.data(), m.proof.size());
      break;
    case AuthKind::kRefused:
      w.text(m.message.substr(0, kMaxAuthMessageBytes));
      break;
  }
  return w.finish();
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

bool decode_auth(std::span<const uint8_t> payload, AuthMessage* out, std::string* reason) {
  Reader rd(payload);
  uint8_t code = 0;
  if (!rd.u8("authentication kind", &code)) return rd.finish("authentication", reason);
  switch (static_cast<AuthKind>(code)) {
    case AuthKind::kServerHello:
      out->kind = AuthKind::kServerHello;
      rd.u32("auth version", &out->version);
      rd.raw("nonce", out->nonce.size(), out->nonce.data());
      return rd.finish("SERVER_HELLO", reason);
    case AuthKind::kClientProof:
      out->kind = AuthKind::kClientProof;
      rd.u32("auth version", &out->version);
      rd.raw("nonce", out->nonce.size(), out->nonce.data());
      rd.raw("proof", out->proof.size(), out->proof.data());
      return rd.finish("CLIENT_PROOF", reason);
    case AuthKind::kServerProof:
      out->kind = AuthKind::kServerProof;
      rd.raw("proof", out->proof.size(), out->proof.data());
      return rd.finish("SERVER_PROOF", reason);
    case AuthKind::kRefused:
      out->kind = AuthKind::kRefused;
      rd.text("message", kMaxAuthMessageBytes, &out->message);
      return rd.finish("REFUSED", reason);
  }
  if (valid_op(code)) {
    rd.fail("got a " + std::string(op_name(static_cast<Op>(code))) +
            " request before the authentication (a client without the job token "
            "handshake: an older chorus, or not chorus)");
  } else {
    rd.fail("unknown authentication kind " + std::to_string(code));
  }
  return rd.finish("authentication", reason);
}

namespace {

AuthMessage read_auth(int fd, const Deadline& deadline, const std::string& where,
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
  AuthMessage message;
  if (!decode_auth(payload, &message, &reason)) {
    throw StoreError(what + ": " + reason + " (not a chorus store of this version?)");
  }
  if (message.kind == AuthKind::kRefused) {
    throw StoreError(where + " refused this process: " + message.message);
  }
  return message;
}

}  // namespace

void authenticate_client(int fd, const std::string& token, const Deadline& deadline,
                         const std::string& where) {
  try {
    AuthMessage hello = read_auth(fd, deadline, where, "waiting for the server's challenge");
    if (hello.kind != AuthKind::kServerHello) {
      throw StoreError(where + ": authentication: expected the server's challenge, got message "
                               "kind " +
                       std::to_string(static_cast<int>(hello.kind)));
    }
    if (hello.version != kAuthVersion) {
      throw StoreError(where + ": authentication version differs (server " +
                       std::to_string(hello.version) + ", here " +
                       std::to_string(kAuthVersion) + ")");
    }
    AuthMessage proof;
    proof.kind = AuthKind::kClientProof;
    proof.nonce = auth::make_nonce();
    proof.proof =
        auth::prove(token, kAuthContext, auth::Role::kClient, proof.nonce, hello.nonce);
    Bytes frame = encode_auth(proof);
    net::write_full(fd, frame.data(), frame.size(), deadline,
                    where + ": authentication, sending the proof of the job token");
    AuthMessage answer = read_auth(fd, deadline, where, "waiting for the server's proof");
    if (answer.kind != AuthKind::kServerProof) {
      throw StoreError(where + ": authentication: expected the server's proof, got message "
                               "kind " +
                       std::to_string(static_cast<int>(answer.kind)));
    }
    auth::Proof expected =
        auth::prove(token, kAuthContext, auth::Role::kServer, proof.nonce, hello.nonce);
    if (!auth::same_proof(answer.proof, expected)) {
      throw StoreError(where + " could not prove it holds this job's token: " +
                       auth::kTokenMismatch + " (is it the store of another job?)");
    }
  } catch (const PeerError& e) {
    throw StoreError(where + " closed the connection during the authentication (" + e.what() +
                     ")");
  }
}

}  // namespace chorus::store_wire
