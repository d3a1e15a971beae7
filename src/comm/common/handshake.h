// The proof half of the challenge-response on the job token (auth.h) that opens every
// chorus TCP connection, store connections and data connections alike: which nonce
// goes where in each proof, which side proves what, and the words of a refusal.
// tcp_store_protocol.h and transport/tcp/handshake.h each carry these proofs in their
// own messages (the store's server speaks first; a data connection's client does, with
// the communicator and ranks its proofs are bound to).
//
// The client proves first, over both nonces; the server checks that proof and only
// then proves in turn, so that whoever reaches a listening port learns nothing
// computed from the token; the client checks the server's proof before it uses the
// connection. The token never leaves the process.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "comm/common/auth.h"

namespace chorus::handshake {

// Both nonces of one connection, each picked by its side (auth::make_nonce()).
struct Nonces {
  auth::Nonce client{};
  auth::Nonce server{};
};

// One connection's proofs: the job token and the context they are bound to (the
// protocol and what the connection is for). A wrong proof is refused with
// auth::kTokenMismatch on either side.
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

// What a client says when the server's proof is wrong: "<who> could not prove it
// holds <whose token>: job token differs (CHORUS_JOB_TOKEN) (<hint>)".
std::string server_unproven(const std::string& who, const std::string& whose_token,
                            const std::string& hint);

}  // namespace chorus::handshake
