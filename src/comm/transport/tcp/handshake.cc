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

// The common flow's kinds on this protocol's wire: 1 to 5 in the header.
MessageKind wire_kind(handshake::Kind kind) {
  return static_cast<MessageKind>(static_cast<uint16_t>(kind) + 1);
}
handshake::Kind common_kind(MessageKind kind) {
  return static_cast<handshake::Kind>(static_cast<uint16_t>(kind) - 1);
}

const char* kind_name(MessageKind kind) { return handshake::kind_name(common_kind(kind)); }

// The kind's name after its article, for messages: "a HELLO", "an ACCEPTED".
std::string with_article(MessageKind kind) {
  return (kind == MessageKind::kAccepted ? "an " : "a ") + std::string(kind_name(kind));
}

using wire::get_le;

uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>(get_le(p, 2)); }
uint32_t get_u32(const uint8_t* p) { return static_cast<uint32_t>(get_le(p, 4)); }

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
    *reason = "expected " + with_article(want) + " message, got " + with_article(kind);
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

// A whole message of kind `want`, its body decoded by the common flow.
bool decode_as(std::span<const uint8_t> message, MessageKind want, handshake::Message* out,
               std::string* reason) {
  std::span<const uint8_t> payload;
  if (!payload_of(message, want, &payload, reason)) return false;
  wire::Reader in(payload);
  handshake::decode_body(common_kind(want), in, out);
  return finish(in, kind_name(want), reason);
}

handshake::Message of_kind(handshake::Kind kind) {
  handshake::Message m;
  m.kind = kind;
  return m;
}

}  // namespace

std::vector<uint8_t> encode_message(const handshake::Message& m) {
  wire::Writer w;
  w.u32(kHelloMagic);
  w.u16(static_cast<uint16_t>(kProtocolVersion));
  w.u16(static_cast<uint16_t>(wire_kind(m.kind)));
  w.u32(0);
  handshake::encode_body(m, w);
  w.u32_at(8, static_cast<uint32_t>(w.size() - kHeaderBytes));
  return w.take();
}

std::vector<uint8_t> hello_fields(const Hello& h) {
  wire::Writer w;
  w.u32(h.endian);
  w.u32(static_cast<uint32_t>(h.from_rank));
  w.u32(static_cast<uint32_t>(h.to_rank));
  w.u32(static_cast<uint32_t>(h.size));
  w.text(std::string_view(h.comm_id).substr(0, kMaxHelloString));
  return w.take();
}

bool decode_hello_fields(std::span<const uint8_t> fields, Hello* out, std::string* reason) {
  wire::Reader in(fields);
  uint32_t from = 0, to = 0, size = 0;
  out->version = kProtocolVersion;
  in.u32("byte order", &out->endian);
  in.u32("rank", &from);
  in.u32("target rank", &to);
  in.u32("size", &size);
  in.text("communicator id", kMaxHelloString, &out->comm_id);
  out->from_rank = static_cast<int32_t>(from);
  out->to_rank = static_cast<int32_t>(to);
  out->size = static_cast<int32_t>(size);
  return finish(in, "HELLO", reason);
}

std::vector<uint8_t> encode_hello(const Hello& h) {
  handshake::Message m = of_kind(handshake::Kind::kHello);
  m.fields = hello_fields(h);
  m.nonce = h.nonce;
  return encode_message(m);
}

std::vector<uint8_t> encode_challenge(const Challenge& c) {
  handshake::Message m = of_kind(handshake::Kind::kChallenge);
  m.nonce = c.nonce;
  return encode_message(m);
}

std::vector<uint8_t> encode_proof(const ProofMessage& p) {
  handshake::Message m = of_kind(handshake::Kind::kProof);
  m.proof = p.proof;
  return encode_message(m);
}

std::vector<uint8_t> encode_verdict(const Verdict& v) {
  if (!v.accepted) return encode_message(handshake::refused(v.refusal));
  handshake::Message m = of_kind(handshake::Kind::kAccepted);
  m.proof = v.proof;
  return encode_message(m);
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
      k > static_cast<uint16_t>(MessageKind::kRefused)) {
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

bool decode_message(std::span<const uint8_t> message, handshake::Message* out,
                    std::string* reason) {
  MessageKind kind{};
  uint32_t length = 0;
  if (!decode_header(message, &kind, &length, reason)) return false;
  return decode_as(message, kind, out, reason);
}

bool decode_hello(std::span<const uint8_t> message, Hello* out, std::string* reason) {
  handshake::Message m;
  if (!decode_as(message, MessageKind::kHello, &m, reason)) return false;
  out->nonce = m.nonce;
  return decode_hello_fields(m.fields, out, reason);
}

bool decode_challenge(std::span<const uint8_t> message, Challenge* out, std::string* reason) {
  handshake::Message m;
  if (!decode_as(message, MessageKind::kChallenge, &m, reason)) return false;
  out->nonce = m.nonce;
  return true;
}

bool decode_proof(std::span<const uint8_t> message, ProofMessage* out, std::string* reason) {
  handshake::Message m;
  if (!decode_as(message, MessageKind::kProof, &m, reason)) return false;
  out->proof = m.proof;
  return true;
}

bool decode_verdict(std::span<const uint8_t> message, Verdict* out, std::string* reason) {
  MessageKind kind = MessageKind::kAccepted;
  uint32_t length = 0;
  if (decode_header(message, &kind, &length, reason) && kind != MessageKind::kRefused) {
    kind = MessageKind::kAccepted;  // anything else is refused as not ACCEPTED
  }
  handshake::Message m;
  if (!decode_as(message, kind, &m, reason)) return false;
  out->accepted = m.kind == handshake::Kind::kAccepted;
  out->proof = m.proof;
  out->refusal = m.refusal;
  return true;
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
                      const Deadline& deadline, const std::string& what, std::string* refusal) {
  handshake::Client client(
      token, proof_context(hello.comm_id, hello.from_rank, hello.to_rank, hello.size),
      hello.nonce);
  bool challenged = false;
  auto send = [&](const handshake::Message& m) {
    send_message(fd, encode_message(m), deadline,
                 what + (m.kind == handshake::Kind::kHello
                             ? ": sending the handshake"
                             : ": sending the proof of the job token"));
  };
  auto receive = [&] {
    std::vector<uint8_t> bytes = read_message(
        fd, deadline, what + (challenged ? ": waiting for the verdict" : ": waiting for the challenge"));
    challenged = true;
    handshake::Message m;
    std::string reason;
    if (!decode_message(bytes, &m, &reason)) throw PeerError(what + ": " + reason);
    return m;
  };
  handshake::Client::Step step = handshake::run_client(client, hello_fields(hello), send, receive);
  switch (step.outcome) {
    case handshake::Client::Outcome::kAccepted:
      return;
    case handshake::Client::Outcome::kRefused:
      if (refusal != nullptr) *refusal = step.why;
      throw PeerError(what + ": the peer refused the connection: " + step.why);
    case handshake::Client::Outcome::kUnproven:
      throw PeerError(handshake::server_unproven(what + ": the peer", "the job token",
                                                 "another process listens at its address?"));
    default:
      throw PeerError(what + ": " + step.why + " (not a chorus peer of this version)");
  }
}

ServerHandshake::ServerHandshake(int fd, const Expected& expected)
    : fd_(fd), expected_(&expected), server_(expected.token) {}

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
      return "handshake: sending the acceptance";
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
  std::vector<uint8_t> bytes;
  bytes.swap(in_);
  header_read_ = false;
  want_ = kHeaderBytes;
  if (refuse_after_read_) return refuse(*refuse_after_read_);
  const char* expected = stage_ == Stage::kHello ? "malformed hello: " : "malformed proof: ";
  handshake::Message message;
  std::string reason;
  if (!decode_message(bytes, &message, &reason)) return refuse(expected + reason);
  // This protocol's hook: its own HELLO fields, checked, and the context of the proofs.
  auto check = [this](std::span<const uint8_t> fields, std::string* context, std::string* why) {
    std::string malformed;
    if (!decode_hello_fields(fields, &hello_, &malformed)) {
      *why = "malformed hello: " + malformed;
      return false;
    }
    if (auto mismatch = check_hello(hello_, *expected_)) {
      *why = *mismatch;
      return false;
    }
    *context = proof_context(hello_.comm_id, hello_.from_rank, hello_.to_rank, hello_.size);
    return true;
  };
  std::optional<handshake::Message> answer = server_.take(message, check);
  switch (server_.stage()) {
    case handshake::Server::Stage::kProof:
      hello_.nonce = message.nonce;
      return queue(*answer, Stage::kChallenge);
    case handshake::Server::Stage::kProved:
      stage_ = Stage::kDecide;
      status_ = Status::kAuthenticated;
      return;
    default:
      refusal_ = server_.refusal();
      return queue(*answer, Stage::kRefusal);
  }
}

void ServerHandshake::accept() {
  status_ = Status::kBusy;
  handshake::Message answer = server_.accept();
  if (!server_.accepted()) refusal_ = server_.refusal();
  queue(answer, server_.accepted() ? Stage::kVerdict : Stage::kRefusal);
}

void ServerHandshake::refuse(const std::string& why) {
  refusal_ = why;
  status_ = Status::kBusy;
  queue(server_.refuse(why), Stage::kRefusal);
}

void ServerHandshake::queue(const handshake::Message& message, Stage stage) {
  out_ = encode_message(message);
  sent_ = 0;
  stage_ = stage;
}

void ServerHandshake::give_up(const std::string& why) {
  if (status_ == Status::kAccepted || status_ == Status::kRefused) return;
  if (stage_ != Stage::kRefusal) refusal_ = why;
  // A message half sent cannot be followed by a refusal the client could read.
  if (sent_ == out_.size()) {
    std::vector<uint8_t> message = encode_message(handshake::refused(refusal_));
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
