// The TCP store's wire protocol. The rules every Store implementation shares (size
// limits, counter text, timeout messages) are in rules.h; the limits are named here
// too, as the wire bounds its fields by them.
//
// Framing: every message is a u32 little-endian payload length followed by the
// payload. A payload is a u8 opcode followed by its fields, in this order:
//
//   request      fields
//   SET          key, value
//   GET          key, u64 timeout_ms       (the server parks it until the key exists)
//   ADD          key, i64 delta
//   COMPARE_SET  key, expected, desired
//   CHECK        keys
//   WAIT         keys, u64 timeout_ms      (the server parks it until all keys exist)
//   DELETE       key
//   NUM_KEYS     -
//
//   reply             fields
//   OK                -                    (SET, WAIT)
//   VALUE             value                (GET, COMPARE_SET)
//   INTEGER           i64                  (ADD, NUM_KEYS)
//   BOOL              u8 0 or 1            (CHECK, DELETE)
//   TIMEOUT           u32 missing, keys    (GET, WAIT: how many keys were missing,
//                                           and the first few of them)
//   INVALID_ARGUMENT  message              (ADD on a value that is not an integer)
//
// A key, value or message is a u32 length and that many bytes; `keys` is a u32 count
// and that many keys; integers are fixed-width little-endian. Every request gets
// exactly one reply, in request order: the server takes a connection's next request
// only once the previous one is answered (a parked GET or WAIT included).
//
// Authentication comes first. Before its first request a connection proves the job
// token with the handshake every chorus connection opens with (comm/common/handshake.h:
// one message flow for store and data connections; the token is never sent), in
// frames like the others whose payload is a u8 authentication kind and the message's
// body:
//
//   client -> server  HELLO      u8 0xB1, u32 auth version, client nonce (32 bytes)
//   server -> client  CHALLENGE  u8 0xB2, server nonce       (or REFUSED)
//   client -> server  PROOF      u8 0xB3, client proof
//   server -> client  ACCEPTED   u8 0xB4, server proof       (or REFUSED)
//                     REFUSED    u8 0xA4, message            (then it closes)
//
// The auth version is the store's own HELLO field: the server refuses another one
// (check_hello_fields, its hook in the common flow). It refuses a peer whose address
// its allow-list does not name when that peer's HELLO arrives. Only a client whose
// proof is right gets the server's proof, and the client checks it before its first
// request. The server handles no request on a connection before that; one that sends
// anything else, a wrong proof, or nothing within the server's authentication timeout
// is refused, closed and logged with its address. Authentication frames are at most
// kMaxAuthFrameBytes.
//
// Version 1 (chorus before the common flow) had the server speak first (SERVER_HELLO,
// 0xA1). REFUSED keeps its code and layout, so that a client of version 1 still reads
// why it was refused; a client of this version names a version-1 server's first frame.
//
// Decoding never trusts a number from the network: every length and count is checked
// against its limit and against the bytes left in the frame before anything is
// allocated, and a malformed frame yields a reason naming the field at fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "comm/common/auth.h"
#include "comm/common/deadline.h"
#include "comm/common/handshake.h"
#include "comm/store/rules.h"

namespace chorus::store::wire {

// Limits of the Store contract (rules.h).
using store::rules::kMaxKeyBytes;
using store::rules::kMaxKeysPerRequest;
using store::rules::kMaxListedKeys;
using store::rules::kMaxValueBytes;
// Room for the opcode, key and length fields next to a largest value. A frame also
// bounds what shares it: COMPARE_SET's expected + desired, and WAIT's keys together.
inline constexpr size_t kFrameHeaderBytes = 64 << 10;
inline constexpr size_t kMaxFrameBytes = kMaxValueBytes + kFrameHeaderBytes;
inline constexpr size_t kMaxMessageBytes = 64 << 10;
inline constexpr size_t kLengthPrefixBytes = 4;

enum class Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kCheck = 5,
  kWait = 6,
  kDelete = 7,
  kNumKeys = 8,
};

enum class ReplyKind : uint8_t {
  kOk = 1,
  kValue = 2,
  kInteger = 3,
  kBool = 4,
  kTimeout = 5,
  kInvalidArgument = 6,
};

// Lower-case name for messages ("get", "compare_set", ...).
const char* op_name(Op op);

struct Request {
  Op op = Op::kNumKeys;
  std::string key;                // SET GET ADD COMPARE_SET DELETE
  std::vector<std::string> keys;  // CHECK WAIT
  Bytes value;                    // SET; COMPARE_SET: desired
  Bytes expected;                 // COMPARE_SET
  int64_t delta = 0;              // ADD
  uint64_t timeout_ms = 0;        // GET WAIT
};

struct Reply {
  ReplyKind kind = ReplyKind::kOk;
  Bytes value;                    // VALUE
  int64_t integer = 0;            // INTEGER
  bool flag = false;              // BOOL
  uint32_t missing_count = 0;     // TIMEOUT: all missing keys
  std::vector<std::string> keys;  // TIMEOUT: the first kMaxListedKeys of them
  std::string message;            // INVALID_ARGUMENT
};

// Whole frames, length prefix included. The caller checks the payload size against
// kMaxFrameBytes (payload_size()) before sending a request it did not validate.
Bytes encode_request(const Request& request);
Bytes encode_reply(const Reply& reply);
size_t payload_size(const Bytes& frame);

// Reads the u32 length prefix at `prefix` (kLengthPrefixBytes bytes).
uint32_t read_length_prefix(const uint8_t* prefix);

// False, with the reason, when a frame of `length` payload bytes must be refused.
bool check_frame_length(uint32_t length, std::string* reason);

// Decode one payload (without its length prefix). False, with a reason naming the
// field at fault, when the payload is malformed; `out` is then unspecified.
bool decode_request(std::span<const uint8_t> payload, Request* out, std::string* reason);
bool decode_reply(std::span<const uint8_t> payload, Reply* out, std::string* reason);

// ---- Authentication ----

// 2: the common handshake flow (the client speaks first; proofs bound to
// "chorus-store-v2").
inline constexpr uint32_t kAuthVersion = 2;
inline constexpr size_t kMaxAuthFrameBytes = 2048;
inline constexpr size_t kMaxAuthMessageBytes = handshake::kMaxRefusalBytes;
// What both proofs of a store connection are bound to.
inline constexpr char kAuthContext[] = "chorus-store-v2";

// The common flow's messages on this protocol's wire.
enum class AuthKind : uint8_t {
  kHello = 0xB1,
  kChallenge = 0xB2,
  kProof = 0xB3,
  kAccepted = 0xB4,
  kRefused = 0xA4,  // as in version 1
};

// A whole frame, length prefix included (a REFUSED message is cut to
// kMaxAuthMessageBytes).
Bytes encode_auth(const handshake::Message& message);
// False, with the reason, when an authentication frame of `length` payload bytes must
// be refused (checked before any of it is buffered).
bool check_auth_frame_length(uint32_t length, std::string* reason);
// Decodes one authentication payload (without its length prefix). False, with a reason
// naming the field at fault, when it is malformed or not an authentication message of
// this version (a request from a client that does not authenticate, say); `out` is
// then unspecified.
bool decode_auth(std::span<const uint8_t> payload, handshake::Message* out,
                 std::string* reason);

// The store's HELLO: its own field, the auth version, and the client's nonce.
handshake::Message hello_message(const auth::Nonce& client_nonce,
                                 uint32_t version = kAuthVersion);
// The store's hook in the common flow (handshake::HelloCheck): the HELLO's fields are
// exactly a u32 auth version equal to kAuthVersion; the context is kAuthContext.
bool check_hello_fields(std::span<const uint8_t> fields, std::string* context,
                        std::string* refusal);

// The client's side of the authentication, on a freshly connected socket
// (handshake::run_client): sends HELLO, answers CHALLENGE with PROOF, reads and checks
// ACCEPTED. `where` names the
// server ("store at HOST:PORT"). Throws StoreError "<where> refused this process: <why>"
// when the server refuses (job token, allow-list), StoreError when the server's proof
// is wrong or it speaks another protocol, TimeoutError when the deadline passes.
void authenticate_client(int fd, const std::string& token, const Deadline& deadline,
                         const std::string& where);

}  // namespace chorus::store::wire
