#include "comm/common/handshake.h"

#include <algorithm>

namespace chorus::handshake {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kHello:
      return "HELLO";
    case Kind::kChallenge:
      return "CHALLENGE";
    case Kind::kProof:
      return "PROOF";
    case Kind::kAccepted:
      return "ACCEPTED";
    case Kind::kRefused:
      return "REFUSED";
  }
  return "unknown";
}

Message refused(std::string why) {
  Message m;
  m.kind = Kind::kRefused;
  m.refusal = std::move(why);
  return m;
}

void encode_body(const Message& m, wire::Writer& w) {
  switch (m.kind) {
    case Kind::kHello:
      w.bytes(m.fields.data(), std::min(m.fields.size(), kMaxHelloFieldsBytes));
      w.array(m.nonce);
      break;
    case Kind::kChallenge:
      w.array(m.nonce);
      break;
    case Kind::kProof:
    case Kind::kAccepted:
      w.array(m.proof);
      break;
    case Kind::kRefused:
      w.text(std::string_view(m.refusal).substr(0, kMaxRefusalBytes));
      break;
  }
}

void decode_body(Kind kind, wire::Reader& in, Message* out) {
  *out = Message{};
  out->kind = kind;
  switch (kind) {
    case Kind::kHello:
      in.bytes("hello fields", kMaxHelloFieldsBytes, &out->fields);
      in.array("nonce", &out->nonce);
      return;
    case Kind::kChallenge:
      in.array("nonce", &out->nonce);
      return;
    case Kind::kProof:
    case Kind::kAccepted:
      in.array("proof", &out->proof);
      return;
    case Kind::kRefused:
      in.text("refusal", kMaxRefusalBytes, &out->refusal);
      return;
  }
  in.fail("unknown handshake message kind");
}

Server Server::refusing(std::string why) {
  Server server{std::string()};
  server.refuse_at_hello_ = std::move(why);
  return server;
}

std::optional<Message> Server::take(const Message& in, const HelloCheck& check) {
  if (stage_ == Stage::kHello) {
    if (refuse_at_hello_) return refuse(*refuse_at_hello_);
    if (in.kind != Kind::kHello) {
      return refuse(std::string("expected a HELLO, got a ") + kind_name(in.kind));
    }
    std::string why;
    if (!check(in.fields, &context_, &why)) return refuse(why);
    nonces_.client = in.nonce;
    nonces_.server = auth::make_nonce();
    stage_ = Stage::kProof;
    Message challenge;
    challenge.kind = Kind::kChallenge;
    challenge.nonce = nonces_.server;
    return challenge;
  }
  if (stage_ == Stage::kProof) {
    if (in.kind != Kind::kProof) {
      return refuse(std::string("expected a PROOF, got a ") + kind_name(in.kind));
    }
    if (!Proofs(token_, context_).client_proved(nonces_, in.proof)) {
      return refuse(auth::kTokenMismatch);
    }
    stage_ = Stage::kProved;
    return std::nullopt;
  }
  return refuse(std::string("unexpected ") + kind_name(in.kind) + " after the handshake");
}

Message Server::accept() {
  if (stage_ != Stage::kProved) return refuse("accepted before the client proved the job token");
  Message m;
  m.kind = Kind::kAccepted;
  m.proof = Proofs(token_, context_).server(nonces_);
  stage_ = Stage::kDone;
  accepted_ = true;
  return m;
}

Message Server::refuse(const std::string& why) {
  stage_ = Stage::kDone;
  accepted_ = false;
  refusal_ = why;
  return refused(why);
}

Message Client::hello(std::vector<uint8_t> fields) const {
  Message m;
  m.kind = Kind::kHello;
  m.fields = std::move(fields);
  m.nonce = nonces_.client;
  return m;
}

Client::Step Client::take(const Message& in) {
  Step step;
  if (in.kind == Kind::kRefused) {
    step.outcome = Outcome::kRefused;
    step.why = in.refusal;
    return step;
  }
  if (!proved_ && in.kind == Kind::kChallenge) {
    nonces_.server = in.nonce;
    step.outcome = Outcome::kSend;
    step.reply.kind = Kind::kProof;
    step.reply.proof = proofs_.client(nonces_);
    proved_ = true;
    return step;
  }
  if (proved_ && in.kind == Kind::kAccepted) {
    step.outcome =
        proofs_.server_proved(nonces_, in.proof) ? Outcome::kAccepted : Outcome::kUnproven;
    return step;
  }
  step.outcome = Outcome::kUnexpected;
  step.why = std::string("expected ") + (proved_ ? "ACCEPTED or REFUSED" : "a CHALLENGE") +
             ", got " + kind_name(in.kind);
  if (!proved_ && in.kind == Kind::kAccepted) step.why += " before any proof of the job token";
  return step;
}

Client::Step run_client(Client& client, std::vector<uint8_t> fields,
                        const std::function<void(const Message&)>& send,
                        const std::function<Message()>& receive) {
  send(client.hello(std::move(fields)));
  while (true) {
    Client::Step step = client.take(receive());
    if (step.outcome != Client::Outcome::kSend) return step;
    send(step.reply);
  }
}

std::string server_unproven(const std::string& who, const std::string& whose_token,
                            const std::string& hint) {
  return who + " could not prove it holds " + whose_token + ": " + auth::kTokenMismatch + " (" +
         hint + ")";
}

}  // namespace chorus::handshake
