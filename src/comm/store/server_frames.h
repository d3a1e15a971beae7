// The frames the TCP store server takes from a client's input and sends back
// (tcp_store_protocol.h): the authentication's (their logic is handshake::Server's)
// and requests. No sockets' bookkeeping, which stays in the server's loop
// (tcp_store_server.cc).
#pragma once

#include <string>

#include "chorus/store.h"
#include "comm/common/handshake.h"
#include "comm/store/tcp_store_protocol.h"

namespace chorus::store::server {

// Tells a refused client why (REFUSED), when its socket takes the few bytes at once;
// the caller closes the connection.
void send_refusal(int fd, const std::string& reason);

// What taking a frame out of a client's input gave.
enum class Take { kIncomplete, kReady, kRefused };

// Takes the client's next authentication message (HELLO, then PROOF) out of the front
// of `in` (the bytes received so far) into `message`, for the connection's
// handshake::Server. kIncomplete: more bytes are needed (an oversized length prefix is
// refused at once, before it is buffered). kRefused: the frame is malformed or not an
// authentication message of this version; `refusal` says why.
Take take_auth(Bytes& in, handshake::Message* message, std::string* refusal);

// Takes the next request frame out of the front of `in` into `request`. kIncomplete:
// more bytes are needed (`in` then has room reserved for the whole frame, its length
// checked first). kRefused: the frame is malformed or oversized, `reason` says why.
Take take_request(Bytes& in, store::wire::Request* request, std::string* reason);

}  // namespace chorus::store::server
