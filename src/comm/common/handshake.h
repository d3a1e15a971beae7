// The one handshake that opens every chorus TCP connection, store connections and data
// connections alike: a mutual challenge-response on the job token (auth.h), as one
// message flow that both protocols follow in the same order:
//
//   client -> server  HELLO      the protocol's own fields, then the client nonce
//   server -> client  CHALLENGE  the server nonce            (or REFUSED: why)
//   client -> server  PROOF      the client's proof
//   server -> client  ACCEPTED   the server's proof          (or REFUSED: why)
//
// The client proves first, over both nonces; the server checks that proof and only
// then proves in turn, so that whoever reaches a listening port learns nothing
// computed from the token; the client checks the server's proof before it uses the
// connection. A wrong proof is refused with auth::kTokenMismatch. The token never
// leaves the process. Both proofs are bound to a context the protocol names: the
// protocol and its version, and what the connection is for (the store, or the
// communicator and both ranks), so that a proof is worth nothing on another connection.
//
// This file holds the flow once: the messages (Message), the bodies' byte layout (after
// the kind, which each protocol's framing carries), and a server side and a client side
// as small state machines that take one message and give the answer, with no I/O, so
// that a non-blocking event loop (the store's server, a mesh's acceptor) and a
// blocking caller drive the same code. Each protocol keeps only its framing, its own
// HELLO fields and their check (a hook), and its words for errors:
// store/tcp_store_protocol.h and transport/tcp/handshake.h.
//
// Bodies (integers little-endian, comm/common/wire.h):
//   HELLO      u32 length and the protocol's fields (at most kMaxHelloFieldsBytes;
//              the protocol decodes them), then the client nonce (32 bytes)
//   CHALLENGE  server nonce (32 bytes)
//   PROOF      client proof (32 bytes)
//   ACCEPTED   server proof (32 bytes)
//   REFUSED    u32 length and the reason, at most kMaxRefusalBytes
// The framing bounds a whole message before anything is buffered.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/common/auth.h"
#include "comm/common/wire.h"

namespace chorus::handshake {

inline constexpr size_t kMaxRefusalBytes = 1024;
inline constexpr size_t kMaxHelloFieldsBytes = 1536;

enum class Kind : uint8_t { kHello, kChallenge, kProof, kAccepted, kRefused };

// "HELLO", "CHALLENGE", "PROOF", "ACCEPTED", "REFUSED".
const char* kind_name(Kind kind);

struct Message {
  Kind kind = Kind::kRefused;
  std::vector<uint8_t> fields;  // HELLO: the protocol's own fields
  auth::Nonce nonce{};          // HELLO: the client's; CHALLENGE: the server's
  auth::Proof proof{};          // PROOF: the client's; ACCEPTED: the server's
  std::string refusal;          // REFUSED: why (cut to kMaxRefusalBytes when encoded)
};

Message refused(std::string why);

// The body of `m` (everything after the kind, which the framing carries).
void encode_body(const Message& m, wire::Writer& w);
// Reads the body of a message of `kind` from `in` into `out` (reset first). Failures
// are recorded in `in` (Reader::finish() says why, naming the field, and whether bytes
// are left over).
void decode_body(Kind kind, wire::Reader& in, Message* out);

// Both nonces of one connection, each picked by its side (auth::make_nonce()).
struct Nonces {
  auth::Nonce client{};
  auth::Nonce server{};
};

// One connection's proofs: the job token and the context they are bound to.
class Proofs {
 public:
  Proofs(std::string_view token, std::string context)
      : token_(token), context_(std::move(context)) {}

  // The proof the client sends, and the server's check of it.
  auth::Proof client(const Nonces& nonces) const { return prove(auth::Role::kClient, nonces); }
  bool client_proved(const Nonces& nonces, const auth::Proof& proof) const {
    return auth::same_proof(proof, client(nonces));
  }
  // The proof the server sends once the client proved, and the client's check of it.
  auth::Proof server(const Nonces& nonces) const { return prove(auth::Role::kServer, nonces); }
  bool server_proved(const Nonces& nonces, const auth::Proof& proof) const {
    return auth::same_proof(proof, server(nonces));
  }

 private:
  auth::Proof prove(auth::Role role, const Nonces& nonces) const {
    return auth::prove(token_, context_, role, nonces.client, nonces.server);
  }

  std::string token_;
  std::string context_;
};

// The protocol's hook for a HELLO's own fields: true with the context the proofs of
// this connection are bound to, or false with why it refuses (naming the field).
using HelloCheck = std::function<bool(std::span<const uint8_t> fields, std::string* context,
                                      std::string* refusal)>;

// The server's side of one connection, message by message:
//
//   kHello  --HELLO, check passes-->  CHALLENGE  --> kProof
//   kProof  --PROOF, right proof-->   (nothing)  --> kProved: the caller accept()s
//                                                    (ACCEPTED) or refuse()s
//   anything else, a failed check, a wrong proof --> REFUSED --> kDone, refused()
class Server {
 public:
  enum class Stage { kHello, kProof, kProved, kDone };

  explicit Server(std::string token) : token_(std::move(token)) {}
  // A server that answers the HELLO with REFUSED(why) whatever it says (an address
  // the allow-list does not name): it takes the client's first message, so that
  // closing does not reset the connection before the client reads why.
  static Server refusing(std::string why);

  // Takes the client's next message and returns the answer to send: CHALLENGE after
  // a HELLO that `check` passes; nothing after a right PROOF (kProved); REFUSED for
  // anything else (kDone). `check` is called for a HELLO only.
  std::optional<Message> take(const Message& in, const HelloCheck& check);
  // At kProved: ACCEPTED with the server's proof.
  Message accept();
  // Refuses now, at any stage (kDone): REFUSED(why).
  Message refuse(const std::string& why);

  Stage stage() const { return stage_; }
  bool accepted() const { return accepted_; }
  // Why the connection was refused, once it was.
  const std::string& refusal() const { return refusal_; }
  // The allow-list's refusal waiting for the HELLO, if any (refusing()).
  const std::optional<std::string>& refusing_why() const { return refuse_at_hello_; }

 private:
  std::string token_;
  std::string context_;
  Nonces nonces_;
  Stage stage_ = Stage::kHello;
  bool accepted_ = false;
  std::string refusal_;
  std::optional<std::string> refuse_at_hello_;
};

// The client's side of one connection:
//
//   hello()                      HELLO
//   take(CHALLENGE)  -> kSend    PROOF (reply)
//   take(ACCEPTED)   -> kAccepted when the server's proof is right, else kUnproven
//   take(REFUSED)    -> kRefused (why: the server's words)
//   anything else    -> kUnexpected (why: what came instead)
class Client {
 public:
  Client(std::string_view token, std::string context, const auth::Nonce& nonce)
      : proofs_(token, std::move(context)) {
    nonces_.client = nonce;
  }

  enum class Outcome { kSend, kAccepted, kRefused, kUnproven, kUnexpected };
  struct Step {
    Outcome outcome = Outcome::kUnexpected;
    Message reply;    // kSend: the PROOF
    std::string why;  // kRefused, kUnexpected
  };

  Message hello(std::vector<uint8_t> fields) const;
  Step take(const Message& in);

 private:
  Proofs proofs_;
  Nonces nonces_;
  bool proved_ = false;  // the PROOF was sent
};

// The client's whole side over a blocking connection: sends the HELLO, answers the
// CHALLENGE, checks the ACCEPTED. `receive` reads one whole message (it throws the
// protocol's errors for framing and deadlines). Returns the last step: kAccepted, or
// why not.
Client::Step run_client(Client& client, std::vector<uint8_t> fields,
                        const std::function<void(const Message&)>& send,
                        const std::function<Message()>& receive);

// What a client says when the server's proof is wrong: "<who> could not prove it
// holds <whose token>: job token differs (CHORUS_JOB_TOKEN) (<hint>)".
std::string server_unproven(const std::string& who, const std::string& whose_token,
                            const std::string& hint);

}  // namespace chorus::handshake
