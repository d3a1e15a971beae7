// The frames the TCP store server takes from a client's input and sends back
// (tcp_store_protocol.h): the authentication's, with the check of the client's proof,
// and requests. No sockets' bookkeeping, which stays in the server's loop
// (tcp_store_server.cc).
#pragma once

#include <string>

#include "chorus/store.h"
#include "comm/common/auth.h"
#include "comm/common/handshake.h"
#include "comm/store/tcp_store_protocol.h"

namespace chorus::store_server {

// The SERVER_HELLO frame carrying `server_nonce`.
Bytes hello_frame(const auth::Nonce& server_nonce);

// Tells a refused client why, when its socket takes the few bytes at once; the caller
// closes the connection.
void send_refusal(int fd, const std::string& reason);

// What taking a frame out of a client's input gave.
enum class Take { kIncomplete, kReady, kRefused };

// Takes the client's CLIENT_PROOF out of the front of `in` (the bytes received so far)
// and checks it with `proofs` (bound to store_wire::kAuthContext). kIncomplete: more
// bytes are needed (an oversized length prefix is refused at once, before it is
// buffered). kReady: the client proved the token, and the SERVER_PROOF frame is
// appended to `out`. kRefused: `refusal` says why (malformed, another kind or version,
// or auth::kTokenMismatch).
Take take_client_proof(Bytes& in, const handshake::Proofs& proofs,
                           const auth::Nonce& server_nonce, Bytes* out, std::string* refusal);

// Takes the next request frame out of the front of `in` into `request`. kIncomplete:
// more bytes are needed (`in` then has room reserved for the whole frame, its length
// checked first). kRefused: the frame is malformed or oversized, `reason` says why.
Take take_request(Bytes& in, store_wire::Request* request, std::string* reason);

}  // namespace chorus::store_server
