// Challenge-response authentication with the job token (CHORUS_JOB_TOKEN), shared by
// the TCP store and the TCP transport. The token itself never crosses the wire.
//
// Each side of a connection picks a fresh random nonce. Each proves it holds the token
// with HMAC-SHA256(token, "chorus-auth-v1" | context | role | client nonce | server
// nonce), and checks the other's proof in constant time. `context` names the protocol
// and what the connection is for (the store, or a communicator and its two ranks), so
// that a proof made for one connection is worth nothing on another; `role` keeps a
// side from answering with the other side's own proof. Both nonces are fresh, so a
// recorded proof cannot be replayed.
//
// The side that connects proves first; the accepting side proves only to a client
// that has proven, so that whoever can reach a listening port learns nothing computed
// from the token.
//
// An empty token is a token like any other: both sides then prove "no token", and a
// process with a token and one without refuse each other.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

// Which side of the connection a proof speaks for.
enum class Role : uint8_t {
  kClient = 1,  // the side that connected
  kServer = 2,  // the side that accepted
};

// The words both sides use when a proof does not match.
inline constexpr char kTokenMismatch[] = "job token differs (CHORUS_JOB_TOKEN)";

// A nonce from the operating system's random generator (OpenSSL RAND_bytes). Throws
// SystemError when no random bytes can be had.
Nonce make_nonce();

// HMAC-SHA256 of `message` keyed with `key` (any length, empty included).
Proof hmac_sha256(std::string_view key, const uint8_t* message, size_t length);

// The proof that `role` holds `token` on the connection described by `context`, with
// the client's and the server's nonces.
Proof prove(std::string_view token, std::string_view context, Role role,
            const Nonce& client_nonce, const Nonce& server_nonce);

// Constant-time comparison (CRYPTO_memcmp).
bool same_proof(const Proof& a, const Proof& b);

}  // namespace chorus::auth
