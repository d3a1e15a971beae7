// Writes the seed inputs of the handshake fuzz targets (tests/fuzz/corpus/handshake_fuzz
// and the authentication seeds of tests/fuzz/corpus/store_protocol_fuzz) from the
// encoders themselves, so that the seeds follow the messages when they change. Each
// seed is the target's selector byte and then the message (handshake_fuzz.cc,
// store_protocol_fuzz.cc say what each selector picks). Run from the repository root
// after building chorus_comm in build/:
//
//   g++ -std=c++20 -Isrc -Iinclude -Ibuild/include tests/fuzz/write_seeds.cc \
//       build/lib/libchorus_comm.a -lcrypto -lpthread -o /tmp/write_seeds && /tmp/write_seeds
//
// The nonces and proofs are fixed bytes (any value decodes; fixed ones keep the seeds
// the same from one run to the next).
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "comm/common/handshake.h"
#include "comm/store/tcp_store_protocol.h"
#include "comm/transport/tcp/handshake.h"

namespace {

namespace handshake = chorus::handshake;
namespace tcp = chorus::transport::tcp;
namespace wire = chorus::store::wire;

template <size_t N>
std::array<uint8_t, N> filled(uint8_t first) {
  std::array<uint8_t, N> a{};
  for (size_t i = 0; i < N; ++i) a[i] = static_cast<uint8_t>(first + 7 * i);
  return a;
}

void write(const std::string& path, uint8_t selector, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.put(static_cast<char>(selector));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size() + 1);
}

// A store frame's payload: the fuzz target reads what follows the length prefix.
std::vector<uint8_t> payload(const std::vector<uint8_t>& frame) {
  return std::vector<uint8_t>(frame.begin() + wire::kLengthPrefixBytes, frame.end());
}

handshake::Message of_kind(handshake::Kind kind) {
  handshake::Message m;
  m.kind = kind;
  m.nonce = filled<chorus::auth::kNonceBytes>(0x31);
  m.proof = filled<chorus::auth::kProofBytes>(0x57);
  return m;
}

}  // namespace

int main() {
  const std::string data = "tests/fuzz/corpus/handshake_fuzz/";
  tcp::Hello hello;
  hello.from_rank = 3;
  hello.to_rank = 1;
  hello.size = 4;
  hello.comm_id = "default";
  hello.nonce = filled<chorus::auth::kNonceBytes>(0x31);
  write(data + "hello", 0, tcp::encode_hello(hello));
  tcp::Challenge challenge;
  challenge.nonce = filled<chorus::auth::kNonceBytes>(0x13);
  write(data + "challenge", 1, tcp::encode_challenge(challenge));
  tcp::ProofMessage proof;
  proof.proof = filled<chorus::auth::kProofBytes>(0x57);
  write(data + "proof", 2, tcp::encode_proof(proof));
  tcp::Verdict accepted;
  accepted.accepted = true;
  accepted.proof = filled<chorus::auth::kProofBytes>(0x75);
  write(data + "verdict_accepted", 3, tcp::encode_verdict(accepted));
  tcp::Verdict refused;
  refused.refusal = chorus::auth::kTokenMismatch;
  write(data + "verdict_refused", 3, tcp::encode_verdict(refused));
  write(data + "header", 4, tcp::encode_hello(hello));
  write(data + "message_refused", 4, tcp::encode_message(handshake::refused("byte order differs")));

  const std::string store = "tests/fuzz/corpus/store_protocol_fuzz/";
  constexpr uint8_t kAuth = 2;
  auto auth = [](const handshake::Message& m) { return payload(wire::encode_auth(m)); };
  write(store + "auth_hello", kAuth,
        auth(wire::hello_message(filled<chorus::auth::kNonceBytes>(0x31))));
  write(store + "auth_challenge", kAuth, auth(of_kind(handshake::Kind::kChallenge)));
  write(store + "auth_proof", kAuth, auth(of_kind(handshake::Kind::kProof)));
  write(store + "auth_accepted", kAuth, auth(of_kind(handshake::Kind::kAccepted)));
  write(store + "auth_refused", kAuth, auth(handshake::refused("refused")));
  // A version-1 server's first payload (SERVER_HELLO: 0xA1, version 1, nonce), which
  // this version names when it refuses it.
  std::vector<uint8_t> v1 = {0xA1, 1, 0, 0, 0};
  for (uint8_t b : filled<chorus::auth::kNonceBytes>(0x31)) v1.push_back(b);
  write(store + "auth_v1_server_hello", kAuth, v1);
  return 0;
}
