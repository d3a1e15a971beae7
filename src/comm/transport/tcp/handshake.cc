#include "comm/transport/tcp/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "chorus/error.h"
#include "comm/common/little_endian.h"
#include "comm/common/socket.h"

namespace chorus::transport::tcp {
namespace {

const char* kind_name(MessageKind kind) {
  switch (kind) {
    case MessageKind::kHello:
      return "HELLO";
    case MessageKind::kChallenge:
      return "CHALLENGE";
    case MessageKind::kProof:
      return "PROOF";
    case MessageKind::kVerdict:
      return "VERDICT";
  }
  return "unknown";
}

using wire_bytes::get_le;
using wire_bytes::put_le;

void put_u16(std::vector<uint8_t>& out, uint16_t v) { put_le(out, v, 2); }
void put_u32(std::vector<uint8_t>& out, uint32_t v) { put_le(out, v, 4); }
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(get_le(p, 2)); }
uint32_t get_u32(const uint8_t* p) { return static_cast<uint32_t>(get_le(p, 4)); }

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// A header and `payload`, the payload length filled in.
std::vector<uint8_t> framed(MessageKind kind, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + payload.size());
  put_u32(out, kHelloMagic);
  put_u16(out, static_cast<uint16_t>(kProtocolVersion));
  put_u16(out, static_cast<uint16_t>(kind));
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Reads fields from a payload, never past its end.
class FieldReader {
 public:
  explicit FieldReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  bool u32(uint32_t* out, const char* field, std::string* reason) {
    if (!have(4, field, reason)) return false;
    *out = get_u32(bytes_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u8(uint8_t* out, const char* field, std::string* reason) {
    if (!have(1, field, reason)) return false;
    *out = bytes_[pos_++];
    return true;
  }
  template <size_t N>
  bool array(std::array<uint8_t, N>* out, const char* field, std::string* reason) {
    if (!have(N, field, reason)) return false;
    std::memcpy(out->data(), bytes_.data() + pos_, N);
    pos_ += N;
    return true;
  }
  bool string(std::string* out, const char* field, std::string* reason) {
    uint32_t length = 0;
    if (!u32(&length, field, reason)) return false;
    if (length > kMaxHelloString) {
      *reason = std::string(field) + " of " + std::to_string(length) +
                " bytes exceeds the limit of " + std::to_string(kMaxHelloString);
      return false;
    }
    if (!have(length, field, reason)) return false;
    out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return true;
  }
  bool finish(const char* message, std::string* reason) {
    if (pos_ == bytes_.size()) return true;
    *reason = std::string(message) + " has " + std::to_string(bytes_.size() - pos_) +
              " bytes after its last field";
    return false;
  }

 private:
  bool have(size_t n, const char* field, std::string* reason) {
    if (bytes_.size() - pos_ >= n) return true;
    *reason = std::string("truncated ") + field + " (" + std::to_string(bytes_.size() - pos_) +
              " bytes left, " + std::to_string(n) + " needed)";
    return false;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// The payload of a whole message of kind `want`; false with the reason otherwise.
bool payload_of(std::span<const uint8_t> message, MessageKind want,
                std::span<const uint8_t>* payload, std::string* reason) {
  MessageKind kind{};
  uint32_t length = 0;
  if (!decode_header(message, &kind, &length, reason)) return false;
  if (kind != want) {
    *reason = std::string("expected a ") + kind_name(want) + " message, got a " + kind_name(kind);
    return false;
  }
  if (message.size() - kHeaderBytes != length) {
    *reason = std::string(kind_name(kind)) + " message is " +
              std::to_string(message.size() - kHeaderBytes) + " payload bytes, its header says " +
              std::to_string(length);
    return false;
  }
  *payload = message.subspan(kHeaderBytes);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_hello(const Hello& h) {
  std::vector<uint8_t> payload;
  put_u32(payload, h.endian);
  put_u32(payload, static_cast<uint32_t>(h.from_rank));
  put_u32(payload, static_cast<uint32_t>(h.to_rank));
  put_u32(payload, static_cast<uint32_t>(h.size));
  put_string(payload, h.comm_id.substr(0, kMaxHelloString));
  payload.insert(payload.end(), h.nonce.begin(), h.nonce.end());
  return framed(MessageKind::kHello, payload);
}

std::vector<uint8_t> encode_challenge(const Challenge& c) {
  return framed(MessageKind::kChallenge, std::vector<uint8_t>(c.nonce.begin(), c.nonce.end()));
}

std::vector<uint8_t> encode_proof(const ProofMessage& p) {
  return framed(MessageKind::kProof, std::vector<uint8_t>(p.proof.begin(), p.proof.end()));
}

std::vector<uint8_t> encode_verdict(const Verdict& v) {
  std::vector<uint8_t> payload;
  payload.push_back(v.accepted ? 1 : 0);
  if (v.accepted) {
    payload.insert(payload.end(), v.proof.begin(), v.proof.end());
  } else {
    put_string(payload, v.refusal.substr(0, kMaxHelloString));
  }
  return framed(MessageKind::kVerdict, payload);
}

bool decode_header(std::span<const uint8_t> header, MessageKind* kind, uint32_t* payload_length,
                   std::string* reason) {
  if (header.size() < kHeaderBytes) {
    *reason = "message of " + std::to_string(header.size()) + " bytes is shorter than a header";
    return false;
  }
  uint32_t magic = get_u32(header.data());
  if (magic != kHelloMagic) {
    *reason = "not a chorus peer (bad magic number)";
    return false;
  }
  uint16_t version = get_u16(header.data() + 4);
  if (version != kProtocolVersion) {
    *reason = "protocol version differs (peer " + std::to_string(version) + ", here " +
              std::to_string(kProtocolVersion) + ")";
    return false;
  }
  uint16_t k = get_u16(header.data() + 6);
  if (k < static_cast<uint16_t>(MessageKind::kHello) ||
      k > static_cast<uint16_t>(MessageKind::kVerdict)) {
    *reason = "unknown handshake message kind " + std::to_string(k);
    return false;
  }
  uint32_t length = get_u32(header.data() + 8);
  if (length > kMaxPayload) {
    *reason = "handshake message of " + std::to_string(length) +
              " bytes exceeds the limit of " + std::to_string(kMaxPayload);
    return false;
  }
  *kind = static_cast<MessageKind>(k);
  *payload_length = length;
  return true;
}

bool decode_hello(std::span<const uint8_t> message, Hello* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kHello, &payload, reason)) return false;
  FieldReader in(payload);
  uint32_t from = 0, to = 0, size = 0;
  out->version = kProtocolVersion;
  if (!in.u32(&out->endian, "byte order", reason) || !in.u32(&from, "rank", reason) ||
      !in.u32(&to, "target rank", reason) || !in.u32(&size, "size", reason) ||
      !in.string(&out->comm_id, "communicator id", reason) ||
      !in.array(&out->nonce, "nonce", reason)) {
    return false;
  }
  out->from_rank = static_cast<int32_t>(from);
  out->to_rank = static_cast<int32_t>(to);
  out->size = static_cast<int32_t>(size);
  return in.finish("HELLO", reason);
}

bool decode_challenge(std::span<const uint8_t> message, Challenge* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kChallenge, &payload, reason)) return false;
  FieldReader in(payload);
  return in.array(&out->nonce, "nonce", reason) && in.finish("CHALLENGE", reason);
}

bool decode_proof(std::span<const uint8_t> message, ProofMessage* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kProof, &payload, reason)) return false;
  FieldReader in(payload);
  return in.array(&out->proof, "proof", reason) && in.finish("PROOF", reason);
}

bool decode_verdict(std::span<const uint8_t> message, Verdict* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kVerdict, &payload, reason)) return false;
  FieldReader in(payload);
  uint8_t accepted = 0;
  if (!in.u8(&accepted, "verdict", reason)) return false;
  if (accepted > 1) {
    *reason = "verdict " + std::to_string(accepted) + " is neither 0 (refused) nor 1 (accepted)";
    return false;
  }
  out->accepted = accepted == 1;
  out->refusal.clear();
  bool ok = out->accepted ? in.array(&out->proof, "proof", reason)
                          : in.string(&out->refusal, "refusal", reason);
  return ok && in.finish("VERDICT", reason);
}

std::string proof_context(const std::string& comm_id, int from_rank, int to_rank, int size) {
  return "chorus-tcp-v" + std::to_string(kProtocolVersion) + " communicator " + comm_id +
         " from " + std::to_string(from_rank) + " to " + std::to_string(to_rank) + " of " +
         std::to_string(size);
}

std::optional<std::string> check_hello(const Hello& h, const Expected& e) {
  if (h.version != kProtocolVersion) {
    return "protocol version differs (peer " + std::to_string(h.version) + ", here " +
           std::to_string(kProtocolVersion) + ")";
  }
  if (h.endian != kEndianCheck) return "byte order differs";
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
  if (h.from_rank < 0 || h.from_rank >= e.size || h.from_rank == e.rank) {
    return "peer rank " + std::to_string(h.from_rank) + " is not a rank that connects to rank " +
           std::to_string(e.rank);
  }
  return std::nullopt;
}

void send_message(int fd, const std::vector<uint8_t>& message, const Deadline& deadline,
                  const std::string& what) {
  net::write_full(fd, message.data(), message.size(), deadline, what);
}

std::vector<uint8_t> read_message(int fd, const Deadline& deadline, const std::string& what) {
  std::vector<uint8_t> message(kHeaderBytes);
  net::read_full(fd, message.data(), kHeaderBytes, deadline, what);
  MessageKind kind{};
  uint32_t length = 0;
  std::string reason;
  if (!decode_header(message, &kind, &length, &reason)) throw PeerError(what + ": " + reason);
  message.resize(kHeaderBytes + length);  // length was checked against kMaxPayload
  net::read_full(fd, message.data() + kHeaderBytes, length, deadline, what);
  return message;
}

MessageKind kind_of(std::span<const uint8_t> message) {
  return static_cast<MessageKind>(get_u16(message.data() + 6));
}

void client_handshake(int fd, const Hello& hello, const std::string& token,
                      const Deadline& deadline, const std::string& what) {
  std::string reason;
  send_message(fd, encode_hello(hello), deadline, what + ": sending the handshake");
  std::vector<uint8_t> message = read_message(fd, deadline, what + ": waiting for the challenge");
  auto refused = [&](const std::vector<uint8_t>& m) {
    Verdict verdict;
    if (!decode_verdict(m, &verdict, &reason)) throw PeerError(what + ": " + reason);
    if (verdict.accepted) {
      throw PeerError(what + ": the peer accepted the connection before any proof of the job "
                             "token (not a chorus peer of this version)");
    }
    throw PeerError(what + ": the peer refused the connection: " + verdict.refusal);
  };
  if (kind_of(message) == MessageKind::kVerdict) refused(message);
  Challenge challenge;
  if (!decode_challenge(message, &challenge, &reason)) throw PeerError(what + ": " + reason);
  std::string context = proof_context(hello.comm_id, hello.from_rank, hello.to_rank, hello.size);
  ProofMessage proof;
  proof.proof = auth::prove(token, context, auth::Role::kClient, hello.nonce, challenge.nonce);
  send_message(fd, encode_proof(proof), deadline, what + ": sending the proof of the job token");
  message = read_message(fd, deadline, what + ": waiting for the verdict");
  Verdict verdict;
  if (!decode_verdict(message, &verdict, &reason)) throw PeerError(what + ": " + reason);
  if (!verdict.accepted) refused(message);
  auth::Proof expected =
      auth::prove(token, context, auth::Role::kServer, hello.nonce, challenge.nonce);
  if (!auth::same_proof(verdict.proof, expected)) {
    throw PeerError(what + ": the peer could not prove it holds the job token: " +
                    auth::kTokenMismatch + " (another process listens at its address?)");
  }
}

ServerHandshake::ServerHandshake(int fd, const Expected& expected)
    : fd_(fd), expected_(&expected) {}

ServerHandshake ServerHandshake::refusal(int fd, const Expected& expected, std::string why) {
  ServerHandshake handshake(fd, expected);
  handshake.refuse_after_read_ = std::move(why);
  return handshake;
}

short ServerHandshake::events() const {
  if (reading()) return POLLIN;
  if (stage_ == Stage::kChallenge || stage_ == Stage::kVerdict || stage_ == Stage::kRefusal) {
    return POLLOUT;
  }
  return 0;
}

std::string ServerHandshake::waiting_for() const {
  if (refuse_after_read_ && stage_ == Stage::kHello) {
    return "handshake: reading the hello of a refused connection";
  }
  switch (stage_) {
    case Stage::kHello:
      return "handshake: reading the hello";
    case Stage::kChallenge:
      return "handshake: sending the challenge";
    case Stage::kProof:
      return "handshake: waiting for the proof of the job token";
    case Stage::kVerdict:
      return "handshake: sending the verdict";
    default:
      return "handshake: sending a refusal";
  }
}

ServerHandshake::Status ServerHandshake::advance() {
  while (status_ == Status::kBusy) {
    int progress = reading() ? read_message_part() : send_queued();
    if (progress == 0) break;    // the socket has no more for now
    if (progress < 0) continue;  // refused (a refusal may be queued to send)
    if (reading()) {
      on_message();
    } else if (stage_ == Stage::kChallenge) {
      stage_ = Stage::kProof;
    } else {
      finish(stage_ == Stage::kVerdict ? Status::kAccepted : Status::kRefused);
    }
  }
  return status_;
}

int ServerHandshake::read_message_part() {
  while (in_.size() < want_) {
    uint8_t buffer[kHeaderBytes + kMaxPayload];
    ssize_t n = ::recv(fd_, buffer, want_ - in_.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) {
      std::string why = n == 0 ? "connection closed by the other side" : std::strerror(errno);
      give_up(waiting_for() + ": " + why);
      return -1;
    }
    in_.insert(in_.end(), buffer, buffer + n);
    if (!header_read_ && in_.size() == kHeaderBytes) {  // recv() took no more than that
      MessageKind kind{};
      uint32_t length = 0;
      std::string reason;
      if (!decode_header(in_, &kind, &length, &reason)) {
        // Another version, or not a chorus peer: say so, in case it listens.
        refuse(refuse_after_read_.value_or(waiting_for() + ": " + reason));
        return -1;
      }
      header_read_ = true;
      want_ = kHeaderBytes + length;  // length was checked against kMaxPayload
    }
  }
  return 1;
}

int ServerHandshake::send_queued() {
  while (sent_ < out_.size()) {
    ssize_t n = ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
    if (n > 0) {
      sent_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    // A refusal that cannot be sent still refuses; only the reason stays unsaid.
    std::string why = waiting_for() + ": " + std::strerror(errno);
    if (stage_ != Stage::kRefusal) refusal_ = why;
    finish(Status::kRefused);
    return -1;
  }
  return 1;
}

void ServerHandshake::on_message() {
  std::vector<uint8_t> message;
  message.swap(in_);
  header_read_ = false;
  want_ = kHeaderBytes;
  if (refuse_after_read_) return refuse(*refuse_after_read_);
  std::string reason;
  if (stage_ == Stage::kHello) {
    if (!decode_hello(message, &hello_, &reason)) return refuse("malformed hello: " + reason);
    if (auto mismatch = check_hello(hello_, *expected_)) return refuse(*mismatch);
    challenge_.nonce = auth::make_nonce();
    return queue(encode_challenge(challenge_), Stage::kChallenge);
  }
  ProofMessage proof;
  if (!decode_proof(message, &proof, &reason)) return refuse("malformed proof: " + reason);
  std::string context = proof_context(hello_.comm_id, hello_.from_rank, hello_.to_rank, hello_.size);
  auth::Proof wanted = auth::prove(expected_->token, context, auth::Role::kClient, hello_.nonce,
                                   challenge_.nonce);
  if (!auth::same_proof(proof.proof, wanted)) return refuse(auth::kTokenMismatch);
  stage_ = Stage::kDecide;
  status_ = Status::kAuthenticated;
}

void ServerHandshake::accept() {
  Verdict verdict;
  verdict.accepted = true;
  std::string context = proof_context(hello_.comm_id, hello_.from_rank, hello_.to_rank, hello_.size);
  verdict.proof = auth::prove(expected_->token, context, auth::Role::kServer, hello_.nonce,
                              challenge_.nonce);
  status_ = Status::kBusy;
  queue(encode_verdict(verdict), Stage::kVerdict);
}

void ServerHandshake::refuse(const std::string& why) {
  refusal_ = why;
  Verdict verdict;
  verdict.refusal = why;
  status_ = Status::kBusy;
  queue(encode_verdict(verdict), Stage::kRefusal);
}

void ServerHandshake::queue(std::vector<uint8_t> message, Stage stage) {
  out_ = std::move(message);
  sent_ = 0;
  stage_ = stage;
}

void ServerHandshake::give_up(const std::string& why) {
  if (status_ == Status::kAccepted || status_ == Status::kRefused) return;
  if (stage_ != Stage::kRefusal) refusal_ = why;
  // A message half sent cannot be followed by a refusal the client could read.
  if (sent_ == out_.size()) {
    Verdict verdict;
    verdict.refusal = refusal_;
    std::vector<uint8_t> message = encode_verdict(verdict);
    ssize_t ignored = ::send(fd_, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
  }
  finish(Status::kRefused);
}

void ServerHandshake::time_out() {
  give_up(waiting_for() + (reading() ? ": timed out waiting for data" : ": timed out sending"));
}

void ServerHandshake::refuse_after_read(const std::string& why) {
  if (status_ != Status::kBusy || refuse_after_read_) return;
  if (stage_ == Stage::kVerdict || stage_ == Stage::kRefusal) return;
  refuse_after_read_ = why;
}

void ServerHandshake::finish(Status status) {
  stage_ = Stage::kDone;
  status_ = status;
}

std::optional<Hello> server_handshake(int fd, const Expected& expected,
                                      const std::function<bool(int)>& duplicate,
                                      const Deadline& deadline, std::string* refusal) {
  ServerHandshake handshake(fd, expected);
  while (true) {
    switch (handshake.advance()) {
      case ServerHandshake::Status::kAuthenticated:
        if (duplicate && duplicate(handshake.hello().from_rank)) {
          handshake.refuse("duplicate connection from rank " +
                           std::to_string(handshake.hello().from_rank));
        } else {
          handshake.accept();
        }
        continue;
      case ServerHandshake::Status::kAccepted:
        return handshake.hello();
      case ServerHandshake::Status::kRefused:
        *refusal = handshake.refusal();
        return std::nullopt;
      case ServerHandshake::Status::kBusy:
        break;
    }
    if (deadline.expired()) {
      handshake.time_out();
      throw TimeoutError(handshake.refusal());
    }
    pollfd p{fd, handshake.events(), 0};
    ::poll(&p, 1, deadline.remaining_ms(1000));
  }
}

}  // namespace chorus::transport::tcp
