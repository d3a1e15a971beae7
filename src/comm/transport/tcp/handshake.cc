#include "comm/transport/tcp/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "chorus/error.h"
#include "comm/common/handshake.h"
#include "comm/common/socket.h"
#include "comm/common/wire.h"

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

using wire::get_le;

uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(get_le(p, 2)); }
uint32_t get_u32(const uint8_t* p) { return static_cast<uint32_t>(get_le(p, 4)); }

// A message's writer with its header written, the payload length still to fill in
// (framed()).
wire::Writer start(MessageKind kind) {
  wire::Writer w;
  w.u32(kHelloMagic);
  w.u16(static_cast<uint16_t>(kProtocolVersion));
  w.u16(static_cast<uint16_t>(kind));
  w.u32(0);
  return w;
}

std::vector<uint8_t> framed(wire::Writer& w) {
  w.u32_at(8, static_cast<uint32_t>(w.size() - kHeaderBytes));
  return w.take();
}

// The reason of a decoder that read all its fields; `message` names it.
bool finish(wire::Reader& in, const char* message, std::string* reason) {
  std::string why;
  if (in.finish(&why)) return true;
  *reason = std::string(message) + ": " + why;
  return false;
}

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
  wire::Writer w = start(MessageKind::kHello);
  w.u32(h.endian);
  w.u32(static_cast<uint32_t>(h.from_rank));
  w.u32(static_cast<uint32_t>(h.to_rank));
  w.u32(static_cast<uint32_t>(h.size));
  w.text(std::string_view(h.comm_id).substr(0, kMaxHelloString));
  w.array(h.nonce);
  return framed(w);
}

std::vector<uint8_t> encode_challenge(const Challenge& c) {
  wire::Writer w = start(MessageKind::kChallenge);
  w.array(c.nonce);
  return framed(w);
}

std::vector<uint8_t> encode_proof(const ProofMessage& p) {
  wire::Writer w = start(MessageKind::kProof);
  w.array(p.proof);
  return framed(w);
}

std::vector<uint8_t> encode_verdict(const Verdict& v) {
  wire::Writer w = start(MessageKind::kVerdict);
  w.u8(v.accepted ? 1 : 0);
  if (v.accepted) {
    w.array(v.proof);
  } else {
    w.text(std::string_view(v.refusal).substr(0, kMaxHelloString));
  }
  return framed(w);
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
  wire::Reader in(payload);
  uint32_t from = 0, to = 0, size = 0;
  out->version = kProtocolVersion;
  in.u32("byte order", &out->endian);
  in.u32("rank", &from);
  in.u32("target rank", &to);
  in.u32("size", &size);
  in.text("communicator id", kMaxHelloString, &out->comm_id);
  in.array("nonce", &out->nonce);
  out->from_rank = static_cast<int32_t>(from);
  out->to_rank = static_cast<int32_t>(to);
  out->size = static_cast<int32_t>(size);
  return finish(in, "HELLO", reason);
}

bool decode_challenge(std::span<const uint8_t> message, Challenge* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kChallenge, &payload, reason)) return false;
  wire::Reader in(payload);
  in.array("nonce", &out->nonce);
  return finish(in, "CHALLENGE", reason);
}

bool decode_proof(std::span<const uint8_t> message, ProofMessage* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kProof, &payload, reason)) return false;
  wire::Reader in(payload);
  in.array("proof", &out->proof);
  return finish(in, "PROOF", reason);
}

bool decode_verdict(std::span<const uint8_t> message, Verdict* out, std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, MessageKind::kVerdict, &payload, reason)) return false;
  wire::Reader in(payload);
  uint8_t accepted = 0;
  if (in.u8("verdict", &accepted) && accepted > 1) {
    in.fail("verdict " + std::to_string(accepted) + " is neither 0 (refused) nor 1 (accepted)");
  }
  out->accepted = accepted == 1;
  out->refusal.clear();
  if (out->accepted) {
    in.array("proof", &out->proof);
  } else {
    in.text("refusal", kMaxHelloString, &out->refusal);
  }
  return finish(in, "VERDICT", reason);
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

namespace {

// The proofs of the connection `hello` asks for.
handshake::Proofs proofs_for(const Hello& hello, const std::string& token) {
  return handshake::Proofs(
      token, proof_context(hello.comm_id, hello.from_rank, hello.to_rank, hello.size));
}

}  // namespace

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
  handshake::Proofs proofs = proofs_for(hello, token);
  ProofMessage proof;
  proof.proof = proofs.client({hello.nonce, challenge.nonce});
  send_message(fd, encode_proof(proof), deadline, what + ": sending the proof of the job token");
  message = read_message(fd, deadline, what + ": waiting for the verdict");
  Verdict verdict;
  if (!decode_verdict(message, &verdict, &reason)) throw PeerError(what + ": " + reason);
  if (!verdict.accepted) refused(message);
  if (!proofs.server_proved({hello.nonce, challenge.nonce}, verdict.proof)) {
    throw PeerError(handshake::server_unproven(what + ": the peer", "the job token",
                                               "another process listens at its address?"));
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
  if (!proofs_for(hello_, expected_->token).client_proved({hello_.nonce, challenge_.nonce},
                                                           proof.proof)) {
    return refuse(auth::kTokenMismatch);
  }
  stage_ = Stage::kDecide;
  status_ = Status::kAuthenticated;
}

void ServerHandshake::accept() {
  Verdict verdict;
  verdict.accepted = true;
  verdict.proof = proofs_for(hello_, expected_->token).server({hello_.nonce, challenge_.nonce});
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
