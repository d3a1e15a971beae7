// The first bytes on every TCP data connection: the job token's handshake of
// comm/common/handshake.h (one flow for store and data connections), in this
// protocol's framing, with its own HELLO fields and their check. Each connection
// carries frames one way, from the connecting rank (the client) to the accepting rank
// (the server); every pair of ranks has two:
//
//   client -> server  HELLO      byte order check, from rank, to rank, world size,
//                                communicator id; client nonce
//   server -> client  CHALLENGE  server nonce                 (or REFUSED: why)
//   client -> server  PROOF      the client's proof
//   server -> client  ACCEPTED   the server's proof           (or REFUSED: why)
//
// The server checks every HELLO field (check_hello, the hook of the common flow) and
// refuses a mismatch with a message naming the field; then it checks the client's
// proof, and only a client that proved the token gets the server's proof. The client
// checks that proof before it uses the connection. Both proofs are bound to
// proof_context(): the protocol version, the communicator, both ranks and the size.
// The job token is never sent.
//
// Every message is a header — u32 magic "CHRS", u16 protocol version, u16 kind
// (MessageKind), u32 payload length — and its payload, the body of
// comm/common/handshake.h; integers are little-endian. A payload is at most kMaxPayload
// bytes and a string at most kMaxHelloString, both checked before anything is
// allocated. A peer of another protocol version is refused by the header's version
// ("protocol version differs (peer 3, here 4)").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/common/auth.h"
#include "comm/common/deadline.h"
#include "comm/common/handshake.h"

namespace chorus::transport::tcp {

inline constexpr uint32_t kHelloMagic = 0x43485253;  // "CHRS"
// 3: one connection per direction; 4: the common handshake flow (ACCEPTED and REFUSED
// instead of VERDICT; proofs bound to "chorus-tcp-v4").
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr uint32_t kEndianCheck = 0x01020304;
inline constexpr size_t kMaxHelloString = 1024;
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kMaxPayload = 2048;

enum class MessageKind : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kAccepted = 4,
  kRefused = 5,
};

struct Hello {
  uint32_t version = kProtocolVersion;  // from the header
  uint32_t endian = kEndianCheck;
  int32_t from_rank = -1;
  int32_t to_rank = -1;
  int32_t size = 0;
  std::string comm_id;
  auth::Nonce nonce{};  // the client's
};

struct Challenge {
  auth::Nonce nonce{};  // the server's
};

struct ProofMessage {
  auth::Proof proof{};  // the client's
};

// ACCEPTED (accepted) or REFUSED.
struct Verdict {
  bool accepted = false;
  auth::Proof proof{};  // the server's, when accepted
  std::string refusal;  // why, when not accepted (at most kMaxHelloString bytes)
};

// What the acceptor expects to see.
struct Expected {
  int rank;  // the acceptor's own rank
  int size;
  std::string comm_id;
  std::string token;  // proven, never compared to anything sent
};

// ---- Pure encoding and decoding (no I/O; the fuzz targets call these) ----

// Whole messages, header included: any message of the common flow, and each kind.
std::vector<uint8_t> encode_message(const handshake::Message& message);
std::vector<uint8_t> encode_hello(const Hello& hello);
std::vector<uint8_t> encode_challenge(const Challenge& challenge);
std::vector<uint8_t> encode_proof(const ProofMessage& proof);
std::vector<uint8_t> encode_verdict(const Verdict& verdict);

// Checks a header (its first kHeaderBytes bytes): magic, version, a known kind, a
// payload length within kMaxPayload. False with the reason otherwise.
bool decode_header(std::span<const uint8_t> header, MessageKind* kind, uint32_t* payload_length,
                   std::string* reason);

// Decodes one whole message (header and payload, nothing after it) of any kind.
bool decode_message(std::span<const uint8_t> message, handshake::Message* out,
                    std::string* reason);
// This protocol's HELLO fields (all of Hello but the version, from the header, and the
// nonce, the common flow's), and their decoding.
std::vector<uint8_t> hello_fields(const Hello& hello);
bool decode_hello_fields(std::span<const uint8_t> fields, Hello* out, std::string* reason);

// Decode one whole message (header and payload, nothing after it) of the named kind
// (a verdict: ACCEPTED or REFUSED).
// False, with a reason naming the field at fault, for anything malformed: another
// kind, a bad header, a length that disagrees with the bytes, an oversized string,
// trailing bytes. Never reads outside `message`; `out` is unspecified on failure.
bool decode_hello(std::span<const uint8_t> message, Hello* out, std::string* reason);
bool decode_challenge(std::span<const uint8_t> message, Challenge* out, std::string* reason);
bool decode_proof(std::span<const uint8_t> message, ProofMessage* out, std::string* reason);
bool decode_verdict(std::span<const uint8_t> message, Verdict* out, std::string* reason);

// The context both proofs of one connection are bound to: the communicator, both ranks
// and the world size.
std::string proof_context(const std::string& comm_id, int from_rank, int to_rank, int size);

// Empty when `hello` is acceptable; else the reason, naming the field.
std::optional<std::string> check_hello(const Hello& hello, const Expected& expected);

// ---- On a socket ----

// Writes one encoded message before the deadline.
void send_message(int fd, const std::vector<uint8_t>& message, const Deadline& deadline,
                  const std::string& what);
// Reads one whole message (header checked before the payload is read). Throws
// PeerError naming `what` for a malformed header or a closed connection, TimeoutError
// when the deadline passes.
std::vector<uint8_t> read_message(int fd, const Deadline& deadline, const std::string& what);
// The kind of a message read_message() returned.
MessageKind kind_of(std::span<const uint8_t> message);

// The client's side, on a connected socket (handshake::run_client): HELLO, CHALLENGE,
// PROOF, ACCEPTED. Returns
// normally once both sides proved the token. Throws PeerError with the server's
// refusal (or why its proof failed), TimeoutError when the deadline passes. `what`
// names the connection ("rank 3 connecting to rank 1 (host h)").
// `refusal`, when given, receives the server's words when it refused.
void client_handshake(int fd, const Hello& hello, const std::string& token,
                      const Deadline& deadline, const std::string& what,
                      std::string* refusal = nullptr);

// The server's side of one connection as a state machine, so that one thread can run
// many handshakes at once, each with its own deadline (the acceptor of a mesh,
// acceptor.h): advance() reads and writes what the socket takes without blocking and
// says where the handshake stands. The messages' logic is handshake::Server's; this
// class reads and writes their frames.
//
//   reading the HELLO -> sending the CHALLENGE -> reading the PROOF -> kAuthenticated
//   kAuthenticated: accept() -> sending ACCEPTED -> kAccepted
//                   refuse(why) -> sending REFUSED -> kRefused
//
// The HELLO is checked (check_hello) when it arrives, the proof of the job token when
// the PROOF does; anything wrong refuses the connection: refusal() says why, naming the
// field, and a REFUSED saying so is sent when the socket takes it (the caller closes
// the socket afterwards either way). Whether a rank is connected twice is the caller's
// to decide, at kAuthenticated: an impostor without the token never gets that far, so
// it cannot take a rank's place. The socket is not owned.
class ServerHandshake {
 public:
  enum class Status { kBusy, kAuthenticated, kAccepted, kRefused };

  ServerHandshake(int fd, const Expected& expected);
  // A connection refused before any handshake (an address the allow-list does not
  // name): takes the client's first message, so that closing does not reset the
  // connection before the client reads why, and answers with a refusal saying `why`.
  static ServerHandshake refusal(int fd, const Expected& expected, std::string why);

  Status advance();
  // What to poll() for while kBusy: POLLIN or POLLOUT.
  short events() const;
  // Whether a whole HELLO has arrived.
  bool hello_received() const { return stage_ != Stage::kHello; }
  // The client's HELLO, from kAuthenticated on.
  const Hello& hello() const { return hello_; }
  // Why the connection was refused, once kRefused.
  const std::string& refusal() const { return refusal_; }

  // At kAuthenticated: sends ACCEPTED (with the server's proof), or REFUSED saying
  // `why`.
  void accept();
  void refuse(const std::string& why);
  // Ends the handshake now (kRefused), saying `why` to the client when its socket
  // takes it at once.
  void give_up(const std::string& why);
  // Ends it at its deadline: kRefused, "handshake: <what it waited for>: timed out".
  void time_out();
  // Refuses with `why` once the message being read now is in (or at once when none
  // is), unless the connection is already past its proof.
  void refuse_after_read(const std::string& why);

 private:
  enum class Stage { kHello, kChallenge, kProof, kDecide, kVerdict, kRefusal, kDone };

  bool reading() const { return stage_ == Stage::kHello || stage_ == Stage::kProof; }
  std::string waiting_for() const;
  // 1: a whole message is in in_; 0: the socket has no more for now; -1: refused (a
  // refusal may be queued).
  int read_message_part();
  // 1: everything queued is sent; 0: the socket takes no more for now; -1: failed
  // (kRefused).
  int send_queued();
  void on_message();
  void queue(const handshake::Message& message, Stage stage);
  void finish(Status status);

  int fd_;
  const Expected* expected_;
  Stage stage_ = Stage::kHello;
  Status status_ = Status::kBusy;
  std::vector<uint8_t> in_;     // the message being read
  size_t want_ = kHeaderBytes;  // its length, once its header is in
  bool header_read_ = false;
  std::vector<uint8_t> out_;
  size_t sent_ = 0;
  Hello hello_;
  handshake::Server server_;
  std::string refusal_;
  std::optional<std::string> refuse_after_read_;
};

// The server's side on one socket, blocking until the deadline (the state machine
// above, polled; the security tests run it against a socket pair). Returns the client's HELLO when it is acceptable and proved the token
// (ACCEPTED is sent); returns nullopt with `*refusal` set when the connection was
// refused (a REFUSED with the reason was sent when possible; the caller
// closes it). `duplicate(rank)` says whether that rank is connected already. Throws
// TimeoutError when the deadline passes first.
std::optional<Hello> server_handshake(int fd, const Expected& expected,
                                      const std::function<bool(int)>& duplicate,
                                      const Deadline& deadline, std::string* refusal);

}  // namespace chorus::transport::tcp
