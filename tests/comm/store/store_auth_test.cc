// The store's side of security (docs/security.md): every store connection proves the
// job token by challenge and response without sending it, both ways; a connection that
// does not, speaks another protocol or stays silent is closed and logged with its
// address and can touch no key; the allow-list refuses other addresses.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <thread>

#include "chorus/chorus.h"
#include "comm/common/auth.h"
#include "comm/common/handshake.h"
#include "comm/common/socket.h"
#include "comm/store/tcp_store_protocol.h"
#include "util/checks.h"
#include "util/security.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The security helpers (util/security.h) and checks (util/checks.h).
using namespace test;

// One store frame's payload (bounded like the server's authentication frames).
Bytes read_store_frame(int fd, Bytes* raw = nullptr) {
  uint8_t prefix[4];
  net::read_full(fd, prefix, 4, Deadline(10s), "test: frame length");
  uint32_t length = store::wire::read_length_prefix(prefix);
  EXPECT_LE(length, store::wire::kMaxAuthFrameBytes);
  Bytes payload(std::min<size_t>(length, store::wire::kMaxAuthFrameBytes));
  net::read_full(fd, payload.data(), payload.size(), Deadline(10s), "test: frame");
  if (raw) {
    raw->insert(raw->end(), prefix, prefix + 4);
    raw->insert(raw->end(), payload.begin(), payload.end());
  }
  return payload;
}

using handshake::Kind;

handshake::Message read_auth(int fd, Bytes* raw = nullptr) {
  Bytes payload = read_store_frame(fd, raw);
  handshake::Message message;
  std::string reason;
  EXPECT_TRUE(store::wire::decode_auth(payload, &message, &reason)) << reason;
  return message;
}

void send_auth(int fd, const handshake::Message& message) {
  send_bytes(fd, store::wire::encode_auth(message));
}

handshake::Message of_kind(Kind kind) {
  handshake::Message m;
  m.kind = kind;
  return m;
}

// The PROOF a client with `token` sends for these nonces.
handshake::Message client_proof(const std::string& token, const auth::Nonce& client_nonce,
                                const auth::Nonce& server_nonce) {
  handshake::Message proof = of_kind(Kind::kProof);
  proof.proof = auth::prove(token, store::wire::kAuthContext, auth::Role::kClient, client_nonce,
                            server_nonce);
  return proof;
}

// Every store connection's first message: the client's HELLO (the common flow of
// comm/common/handshake.h, in the store's frames).
TEST(SecurityStoreProtocol, AuthMessagesRoundTripAndRefuseGarbage) {
  handshake::Message hello = store::wire::hello_message(auth::make_nonce());
  handshake::Message proof = client_proof("t", hello.nonce, auth::make_nonce());
  handshake::Message back;
  std::string reason;
  for (const handshake::Message& m : {hello, proof}) {
    Bytes frame = store::wire::encode_auth(m);
    ASSERT_TRUE(store::wire::decode_auth(std::span(frame).subspan(4), &back, &reason)) << reason;
    EXPECT_EQ(back.kind, m.kind);
    EXPECT_EQ(back.nonce, m.nonce);
    EXPECT_EQ(back.proof, m.proof);
    EXPECT_EQ(back.fields, m.fields);
    // Every truncation is refused.
    for (size_t n = 4; n < frame.size(); ++n) {
      EXPECT_FALSE(store::wire::decode_auth(std::span(frame).subspan(4, n - 4), &back, &reason));
    }
  }
  // The store's HELLO field is its auth version, checked by its hook.
  std::string context;
  EXPECT_TRUE(store::wire::check_hello_fields(hello.fields, &context, &reason)) << reason;
  EXPECT_EQ(context, store::wire::kAuthContext);
  handshake::Message v1 = store::wire::hello_message(auth::make_nonce(), 1);
  EXPECT_FALSE(store::wire::check_hello_fields(v1.fields, &context, &reason));
  EXPECT_EQ(reason, "authentication version differs (client 1, here 2)");
  // A version-1 server's first frame, SERVER_HELLO, is named as such.
  Bytes server_hello(1 + 4 + auth::kNonceBytes, 0);
  server_hello[0] = 0xA1;
  server_hello[1] = 1;
  EXPECT_FALSE(store::wire::decode_auth(server_hello, &back, &reason));
  EXPECT_TRUE(contains(reason, "got a SERVER_HELLO of authentication version 1")) << reason;
  // A request where the authentication belongs, and a hostile message length.
  store::wire::Request set;
  set.op = store::wire::Op::kSet;
  set.key = "k";
  Bytes request = store::wire::encode_request(set);
  EXPECT_FALSE(store::wire::decode_auth(std::span(request).subspan(4), &back, &reason));
  EXPECT_TRUE(contains(reason, "set request before the authentication")) << reason;
  Bytes refused = {0xA4, 0xff, 0xff, 0xff, 0xff};
  EXPECT_FALSE(store::wire::decode_auth(refused, &back, &reason));
  EXPECT_TRUE(contains(reason, "exceeds the limit")) << reason;
  EXPECT_FALSE(store::wire::check_auth_frame_length(store::wire::kMaxAuthFrameBytes + 1, &reason));
  EXPECT_TRUE(store::wire::check_auth_frame_length(store::wire::kMaxAuthFrameBytes, &reason));
}

// ---- The store ----

TcpStoreServerOptions server_options(const std::string& token,
                                     std::chrono::milliseconds auth_timeout = 10s) {
  TcpStoreServerOptions options;
  options.job_token = token;
  options.allowlist_file = "";  // every address, whatever the environment says
  options.auth_timeout = auth_timeout;
  return options;
}

TEST(SecurityStore, RightTokenConnects) {
  TcpStoreServer server(kLoopback, 0, server_options("job-42"));
  TcpStore store(kLoopback, server.port(), 10s, std::string("job-42"));
  store.set("k", std::string("v"));
  EXPECT_EQ(store.get_string("k"), "v");
}

TEST(SecurityStore, WrongTokenIsRefusedLoggedAndWritesNothing) {
  TcpStoreServer server(kLoopback, 0, server_options("right-token"));
  std::string where = "store at 127.0.0.1:" + std::to_string(server.port());
  testing::internal::CaptureStderr();
  std::string message =
      error_of<StoreError>([&] { TcpStore(kLoopback, server.port(), 10s, std::string("wrong")); });
  // A raw client that fails the proof and sends a SET right behind it: the set must not
  // land, the server closes the connection instead.
  net::Fd raw = net::connect_to(kLoopback, server.port(), Deadline(10s), "raw client");
  handshake::Message hello = store::wire::hello_message(auth::make_nonce());
  send_auth(raw.get(), hello);
  handshake::Message challenge = read_auth(raw.get());
  ASSERT_EQ(challenge.kind, Kind::kChallenge);
  Bytes frames = store::wire::encode_auth(client_proof("wrong", hello.nonce, challenge.nonce));
  store::wire::Request set;
  set.op = store::wire::Op::kSet;
  set.key = "stolen";
  set.value = {1, 2, 3};
  Bytes request = store::wire::encode_request(set);
  frames.insert(frames.end(), request.begin(), request.end());
  send_bytes(raw.get(), frames);
  handshake::Message answer = read_auth(raw.get());
  bool closed = closed_by_peer(raw.get(), 10s);
  std::string log = testing::internal::GetCapturedStderr();

  EXPECT_TRUE(contains(message, where + " refused this process")) << message;
  EXPECT_TRUE(contains(message, "job token differs (CHORUS_JOB_TOKEN)")) << message;
  EXPECT_EQ(answer.kind, Kind::kRefused);
  EXPECT_EQ(answer.refusal, "job token differs (CHORUS_JOB_TOKEN)");
  EXPECT_TRUE(closed);
  if (warnings_logged()) {
    EXPECT_TRUE(contains(log, "refused connection from 127.0.0.1:")) << log;
    EXPECT_TRUE(contains(log, net::local_address(raw.get()).str() + ": job token differs"))
        << log;
  }
  TcpStore right(kLoopback, server.port(), 10s, std::string("right-token"));
  EXPECT_FALSE(right.check({"stolen"}));
  EXPECT_EQ(right.num_keys(), 0);
}

TEST(SecurityStore, EmptyTokenAndAnyTokenRefuseEachOther) {
  {
    TcpStoreServer server(kLoopback, 0, server_options(""));
    std::string message =
        error_of<StoreError>([&] { TcpStore(kLoopback, server.port(), 10s, std::string("x")); });
    EXPECT_TRUE(contains(message, "job token differs")) << message;
    TcpStore none(kLoopback, server.port(), 10s, std::string(""));
    none.set("k", std::string("v"));
  }
  {
    TcpStoreServer server(kLoopback, 0, server_options("x"));
    std::string message =
        error_of<StoreError>([&] { TcpStore(kLoopback, server.port(), 10s, std::string("")); });
    EXPECT_TRUE(contains(message, "job token differs")) << message;
  }
}

TEST(SecurityStore, TokenComesFromTheEnvironmentByDefault) {
  ScopedEnv env;
  env.set("CHORUS_JOB_TOKEN", "from-env");
  TcpStoreServerOptions options;
  options.allowlist_file = "";
  TcpStoreServer server(kLoopback, 0, options);
  TcpStore store(kLoopback, server.port(), 10s);  // CHORUS_JOB_TOKEN too
  store.set("k", std::string("v"));
  TcpStore explicit_right(kLoopback, server.port(), 10s, std::string("from-env"));
  EXPECT_EQ(explicit_right.get_string("k"), "v");
  error_of<StoreError>([&] { TcpStore(kLoopback, server.port(), 10s, std::string("other")); });
}

// Old-protocol requests, garbage, an oversized length and a silent client are each
// closed and logged, while the server keeps serving everyone else at once.
TEST(SecurityStore, UnauthenticatedConnectionsAreDroppedAndOthersServed) {
  constexpr auto kAuthTimeout = 1500ms;
  TcpStoreServer server(kLoopback, 0, server_options("t", kAuthTimeout));
  TcpStore good(kLoopback, server.port(), 10s, std::string("t"));
  good.set_timeout(10s);
  testing::internal::CaptureStderr();

  net::Fd silent = net::connect_to(kLoopback, server.port(), Deadline(10s), "silent");
  const auto silent_start = Clock::now();
  // While the silent one has not answered, others connect and are served at once.
  const auto start = Clock::now();
  {
    TcpStore other(kLoopback, server.port(), 10s, std::string("t"));
    other.set("during", std::string("yes"));
  }
  EXPECT_LT(Clock::now() - start, kAuthTimeout) << "a silent client held the server up";

  store::wire::Request set;
  set.op = store::wire::Op::kSet;
  set.key = "old";
  set.value = {1};
  net::Fd old = net::connect_to(kLoopback, server.port(), Deadline(10s), "old protocol");
  send_bytes(old.get(), store::wire::encode_request(set));
  net::Fd garbage = net::connect_to(kLoopback, server.port(), Deadline(10s), "garbage");
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  send_bytes(garbage.get(), Bytes(http.begin(), http.end()));
  net::Fd huge = net::connect_to(kLoopback, server.port(), Deadline(10s), "oversized");
  send_bytes(huge.get(), {0x00, 0x00, 0x00, 0x80});  // 2 GiB announced, none sent

  EXPECT_TRUE(closed_by_peer(old.get(), 5s)) << "old-protocol client";
  EXPECT_TRUE(closed_by_peer(garbage.get(), 5s)) << "garbage";
  EXPECT_TRUE(closed_by_peer(huge.get(), 5s)) << "oversized length";
  EXPECT_TRUE(closed_by_peer(silent.get(), kAuthTimeout + 5s)) << "silent client";
  auto silent_lived = Clock::now() - silent_start;
  std::string log = testing::internal::GetCapturedStderr();

  EXPECT_GE(silent_lived, kAuthTimeout - 100ms) << "silent client dropped before its deadline";
  good.set("after", std::string("fine"));
  EXPECT_EQ(good.get_string("during"), "yes");
  EXPECT_FALSE(good.check({"old"})) << "an unauthenticated SET was applied";
  EXPECT_EQ(good.num_keys(), 2);
  if (warnings_logged()) {
    EXPECT_TRUE(contains(log, net::local_address(old.get()).str() + ": malformed authentication: "
                                                                     "got a set request"))
        << log;
    EXPECT_TRUE(contains(log, net::local_address(garbage.get()).str() + ": frame length"))
        << log;
    EXPECT_TRUE(contains(log, net::local_address(huge.get()).str() +
                                  ": frame length 2147483648 exceeds the limit"))
        << log;
    EXPECT_TRUE(contains(log, net::local_address(silent.get()).str() +
                                  ": did not prove the job token within 1500 ms"))
        << log;
  }
}

// Peers of authentication version 1, whose server spoke first, get words that say
// what happened rather than garbage: a version-1 client, waiting for the server, is
// refused at the authentication timeout with a REFUSED it can read (its code and layout
// did not change), and a version-1 server's SERVER_HELLO is named by this client.
TEST(SecurityStore, PeersOfAuthVersion1AreToldWhy) {
  TcpStoreServer server(kLoopback, 0, server_options("t", 300ms));
  net::Fd old_client = net::connect_to(kLoopback, server.port(), Deadline(10s), "v1 client");
  handshake::Message refusal = read_auth(old_client.get());
  EXPECT_EQ(refusal.kind, Kind::kRefused);
  EXPECT_TRUE(contains(refusal.refusal, "did not prove the job token within 300 ms (it sent no "
                                        "HELLO: a chorus client older than authentication "
                                        "version 2 waits for the server to speak first)"))
      << refusal.refusal;

  net::Fd listener = net::listen_on(kLoopback, 0);
  uint16_t port = net::local_address(listener.get()).port();
  std::thread old_server([&] {
    net::Fd fd = net::accept_before(listener.get(), Deadline(10s), nullptr);
    if (!fd.valid()) return;
    Bytes server_hello = {37, 0, 0, 0, 0xA1, 1, 0, 0, 0};  // SERVER_HELLO, version 1
    server_hello.resize(server_hello.size() + auth::kNonceBytes, 7);
    send_bytes(fd.get(), server_hello);
    closed_by_peer(fd.get(), 10s);
  });
  std::string message =
      error_of<StoreError>([&] { TcpStore(kLoopback, port, 10s, std::string("t")); });
  old_server.join();
  EXPECT_TRUE(contains(message, "got a SERVER_HELLO of authentication version 1")) << message;
}

// The client checks the server's proof too: a listener that does not hold the token
// (another job's store, an impostor) is not trusted with a request.
TEST(SecurityStore, ClientRefusesAServerWithoutTheToken) {
  net::Fd listener = net::listen_on(kLoopback, 0);
  uint16_t port = net::local_address(listener.get()).port();
  std::atomic<bool> request_seen{false};
  std::thread impostor([&] {
    net::Fd fd = net::accept_before(listener.get(), Deadline(10s), nullptr);
    if (!fd.valid()) return;
    read_auth(fd.get());  // HELLO
    handshake::Message challenge = of_kind(Kind::kChallenge);
    challenge.nonce = auth::make_nonce();
    send_auth(fd.get(), challenge);
    read_auth(fd.get());  // PROOF
    handshake::Message answer = of_kind(Kind::kAccepted);
    answer.proof = auth::Proof{};  // it cannot compute the right one
    send_auth(fd.get(), answer);
    uint8_t byte;
    try {
      net::read_full(fd.get(), &byte, 1, Deadline(3s), "impostor");
      request_seen = true;
    } catch (const Error&) {
    }
  });
  std::string message =
      error_of<StoreError>([&] { TcpStore(kLoopback, port, 10s, std::string("secret")); });
  impostor.join();
  EXPECT_TRUE(contains(message, "could not prove it holds this job's token")) << message;
  EXPECT_TRUE(contains(message, "127.0.0.1:" + std::to_string(port))) << message;
  EXPECT_FALSE(request_seen) << "the client sent a request to a server that failed its proof";
}

// What a client sends on the wire never contains the token: a fake store server
// records every byte of the authentication and of the first request.
TEST(SecurityStore, TokenIsNeverOnTheWire) {
  const std::string token = "tok-9f3c1e77-never-sent";
  net::Fd listener = net::listen_on(kLoopback, 0);
  uint16_t port = net::local_address(listener.get()).port();
  Bytes from_client;
  std::thread recorder([&] {
    net::Fd fd = net::accept_before(listener.get(), Deadline(10s), nullptr);
    ASSERT_TRUE(fd.valid());
    handshake::Message hello = read_auth(fd.get(), &from_client);
    handshake::Message challenge = of_kind(Kind::kChallenge);
    challenge.nonce = auth::make_nonce();
    send_auth(fd.get(), challenge);
    read_auth(fd.get(), &from_client);  // PROOF
    handshake::Message answer = of_kind(Kind::kAccepted);
    answer.proof = auth::prove(token, store::wire::kAuthContext, auth::Role::kServer, hello.nonce,
                               challenge.nonce);
    send_auth(fd.get(), answer);
    Bytes request;
    read_store_frame(fd.get(), &request);
    from_client.insert(from_client.end(), request.begin(), request.end());
    send_bytes(fd.get(), store::wire::encode_reply(store::wire::Reply{}));
  });
  {
    TcpStore store(kLoopback, port, 10s, token);
    store.set("key", std::string("value"));
  }
  recorder.join();
  ASSERT_GT(from_client.size(), 40u);
  EXPECT_TRUE(contains_bytes(from_client, "value")) << "the recorder saw no request";
  EXPECT_FALSE(contains_bytes(from_client, token));
  EXPECT_FALSE(contains_bytes(from_client, token.substr(0, 8)));

  // Nor does what the real server sends back.
  TcpStoreServer server(kLoopback, 0, server_options(token));
  net::Fd raw = net::connect_to(kLoopback, server.port(), Deadline(10s), "raw");
  Bytes from_server;
  handshake::Message hello = store::wire::hello_message(auth::make_nonce());
  send_auth(raw.get(), hello);
  handshake::Message challenge = read_auth(raw.get(), &from_server);
  ASSERT_EQ(challenge.kind, Kind::kChallenge);
  send_auth(raw.get(), client_proof(token, hello.nonce, challenge.nonce));
  EXPECT_EQ(read_auth(raw.get(), &from_server).kind, Kind::kAccepted);
  EXPECT_FALSE(contains_bytes(from_server, token));
}

TEST_F(SecurityAllowListEnv, StoreRefusesAddressesNotListed) {
  TempFile file("store.allow", "# only the first loopback address\n127.0.0.1\n");
  TcpStoreServerOptions options = server_options("t");
  options.allowlist_file = file.path();
  TcpStoreServer server(kLoopback, 0, options);
  TcpStore local(kLoopback, server.port(), 10s, std::string("t"));  // from 127.0.0.1
  local.set("k", std::string("v"));

  testing::internal::CaptureStderr();
  net::Fd other = connect_from("127.0.0.2", server.port());
  std::string where = "store at 127.0.0.1:" + std::to_string(server.port());
  std::string message = error_of<StoreError>(
      [&] { store::wire::authenticate_client(other.get(), "t", Deadline(10s), where); });
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(message, where + " refused this process: address 127.0.0.2 is not in "
                                        "the allow-list " + file.path()))
      << message;
  if (warnings_logged()) {
    EXPECT_TRUE(contains(log, "refused connection from 127.0.0.2:")) << log;
  }
  EXPECT_EQ(local.get_string("k"), "v");

  // A malformed file stops the server from starting, naming the file and line.
  TempFile bad("bad.allow", "127.0.0.1\n127.0.0.256\n");
  options.allowlist_file = bad.path();
  std::string config = error_of<ConfigError>([&] { TcpStoreServer s(kLoopback, 0, options); });
  EXPECT_TRUE(contains(config, bad.path())) << config;
  EXPECT_TRUE(contains(config, "line 2")) << config;
}

TEST_F(SecurityAllowListEnv, HcclWhitelistDisableTurnsTheStoreCheckOff) {
  TempFile file("hccl.allow", "127.0.0.1\n");
  env_.set("HCCL_WHITELIST_FILE", file.path().c_str());
  TcpStoreServerOptions options = server_options("t");
  options.allowlist_file.reset();  // from the environment
  {
    TcpStoreServer server(kLoopback, 0, options);
    net::Fd other = connect_from("127.0.0.2", server.port());
    std::string message = error_of<StoreError>(
        [&] { store::wire::authenticate_client(other.get(), "t", Deadline(10s), "store"); });
    EXPECT_TRUE(contains(message, "127.0.0.2 is not in the allow-list")) << message;
    EXPECT_TRUE(contains(message, "HCCL_WHITELIST_FILE")) << message;
  }
  env_.set("HCCL_WHITELIST_DISABLE", "1");
  TcpStoreServer server(kLoopback, 0, options);
  net::Fd other = connect_from("127.0.0.2", server.port());
  store::wire::authenticate_client(other.get(), "t", Deadline(10s), "store");
  store::wire::Request request;
  request.op = store::wire::Op::kNumKeys;
  send_bytes(other.get(), store::wire::encode_request(request));
  Bytes payload = read_store_frame(other.get());
  store::wire::Reply reply;
  std::string reason;
  ASSERT_TRUE(store::wire::decode_reply(payload, &reply, &reason)) << reason;
  EXPECT_EQ(reply.kind, store::wire::ReplyKind::kInteger);
}

}  // namespace
}  // namespace chorus
