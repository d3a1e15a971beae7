// The data connections' side of security (docs/security.md): the tcp transport's
// handshake proves the job token by challenge and response without sending it, refuses
// garbage, old protocols, oversized headers, silent clients and impostors; a mesh still
// forms around refused connections, and the allow-list refuses other addresses.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/chorus.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/socket.h"
#include "comm/transport/roster.h"
#include "comm/transport/tcp/handshake.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "util/checks.h"
#include "util/ranks.h"
#include "util/security.h"
#include "util/streams.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace tcp = transport::tcp;

// The security helpers (util/security.h) and checks (util/checks.h).
using namespace test;

// ---- Data connections (the TCP transport's handshake) ----

tcp::Hello hello_for(int from, int to, int size, const std::string& comm_id) {
  tcp::Hello h;
  h.from_rank = from;
  h.to_rank = to;
  h.size = size;
  h.comm_id = comm_id;
  h.nonce = auth::make_nonce();
  return h;
}

// A connected pair of non-blocking stream sockets.
std::pair<net::Fd, net::Fd> socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    net::throw_errno("test: socketpair", errno);
  }
  net::set_nonblocking(sv[0]);
  net::set_nonblocking(sv[1]);
  return {net::Fd(sv[0]), net::Fd(sv[1])};
}

TEST(SecurityHandshake, MessagesRoundTripAndEveryTruncationIsRefused) {
  tcp::Hello h = hello_for(3, 1, 4, "world");
  std::vector<uint8_t> m = tcp::encode_hello(h);
  tcp::Hello back;
  std::string reason;
  ASSERT_TRUE(tcp::decode_hello(m, &back, &reason)) << reason;
  EXPECT_EQ(back.from_rank, 3);
  EXPECT_EQ(back.to_rank, 1);
  EXPECT_EQ(back.size, 4);
  EXPECT_EQ(back.comm_id, "world");
  EXPECT_EQ(back.nonce, h.nonce);
  for (size_t n = 0; n < m.size(); ++n) {
    EXPECT_FALSE(tcp::decode_hello(std::span(m).first(n), &back, &reason)) << n;
  }
  std::vector<uint8_t> longer = m;
  longer.push_back(0);
  EXPECT_FALSE(tcp::decode_hello(longer, &back, &reason));
  // The payload length says one more byte: the trailing byte is refused by name.
  longer[8] = static_cast<uint8_t>(longer[8] + 1);
  EXPECT_FALSE(tcp::decode_hello(longer, &back, &reason));
  EXPECT_TRUE(contains(reason, "after its last field")) << reason;
  // A communicator id whose length field is hostile.
  std::vector<uint8_t> hostile = m;
  // After the header, the length of the HELLO fields (comm/common/handshake.h), then
  // byte order, ranks and size.
  size_t id_length_at = tcp::kHeaderBytes + 4 + 16;
  hostile[id_length_at + 3] = 0x7f;
  EXPECT_FALSE(tcp::decode_hello(hostile, &back, &reason));
  EXPECT_TRUE(contains(reason, "communicator id of")) << reason;
  EXPECT_TRUE(contains(reason, "exceeds the limit of 1024")) << reason;

  tcp::Verdict refused;
  refused.refusal = "because";
  tcp::Verdict v;
  ASSERT_TRUE(tcp::decode_verdict(tcp::encode_verdict(refused), &v, &reason)) << reason;
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.refusal, "because");
  tcp::Verdict accepted;
  accepted.accepted = true;
  accepted.proof[5] = 9;
  ASSERT_TRUE(tcp::decode_verdict(tcp::encode_verdict(accepted), &v, &reason)) << reason;
  EXPECT_TRUE(v.accepted);
  EXPECT_EQ(v.proof, accepted.proof);
  // Each decoder takes only its own kind.
  EXPECT_FALSE(tcp::decode_challenge(m, nullptr, &reason));
  EXPECT_TRUE(contains(reason, "expected a CHALLENGE message, got a HELLO")) << reason;
}

TEST(SecurityHandshake, ServerRefusesGarbageOldProtocolAndOversizedHeaders) {
  tcp::Expected expected{0, 2, "world", "t"};
  struct Case {
    Bytes bytes;
    std::string refusal;
  };
  // A version-1 hello: magic, version 1, byte order, ranks, size, comm id, token in clear.
  Bytes v1 = {0x53, 0x52, 0x48, 0x43, 1, 0, 0, 0, 4, 3, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0,
              2, 0, 0, 0, 5, 0, 0, 0, 'w', 'o', 'r', 'l', 'd', 1, 0, 0, 0, 't'};
  Bytes oversized = {0x53, 0x52, 0x48, 0x43, static_cast<uint8_t>(tcp::kProtocolVersion), 0, 1, 0,
                     0xff, 0xff, 0xff, 0x7f};
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<Case> cases = {
      {Bytes(http.begin(), http.end()), "not a chorus peer (bad magic number)"},
      {v1, "protocol version differs (peer 1, here " + std::to_string(tcp::kProtocolVersion) + ")"},
      {oversized, "handshake message of 2147483647 bytes exceeds the limit of 2048"},
  };
  for (const Case& c : cases) {
    auto [client, server] = socket_pair();
    send_bytes(client.get(), c.bytes);
    std::string refusal;
    auto hello = tcp::server_handshake(server.get(), expected, {}, Deadline(5s), &refusal);
    EXPECT_FALSE(hello.has_value());
    EXPECT_TRUE(contains(refusal, c.refusal)) << refusal;
    server.reset();
    // The client is told why before the connection closes.
    std::vector<uint8_t> answer;
    if (c.bytes != v1) {  // a version-1 peer could not read it anyway
      answer = tcp::read_message(client.get(), Deadline(5s), "test client");
      tcp::Verdict verdict;
      std::string reason;
      ASSERT_TRUE(tcp::decode_verdict(answer, &verdict, &reason)) << reason;
      EXPECT_FALSE(verdict.accepted);
      EXPECT_TRUE(contains(verdict.refusal, c.refusal)) << verdict.refusal;
    }
  }
}

TEST(SecurityHandshake, SilentClientTimesOut) {
  auto [client, server] = socket_pair();
  tcp::Expected expected{0, 2, "world", "t"};
  std::string refusal;
  const auto start = Clock::now();
  EXPECT_THROW(tcp::server_handshake(server.get(), expected, {}, Deadline(300ms), &refusal),
               TimeoutError);
  EXPECT_LT(Clock::now() - start, 5s);
  // And a client whose server never answers gives up at its deadline too.
  auto [c2, s2] = socket_pair();
  const auto start2 = Clock::now();
  EXPECT_THROW(tcp::client_handshake(c2.get(), hello_for(1, 0, 2, "world"), "t", Deadline(300ms),
                                     "test client"),
               TimeoutError);
  EXPECT_LT(Clock::now() - start2, 5s);
}

// Runs the client's handshake on a thread against server_handshake on this one.
struct HandshakeResult {
  std::optional<tcp::Hello> accepted;
  std::string refusal;
  std::string client_error;  // empty when the client succeeded
};

HandshakeResult run_handshake(const std::string& client_token, const std::string& server_token) {
  auto [client, server] = socket_pair();
  HandshakeResult result;
  std::thread t([&, fd = client.get()] {
    try {
      tcp::client_handshake(fd, hello_for(1, 0, 2, "world"), client_token, Deadline(10s),
                            "rank 1 connecting to rank 0 (host h)");
    } catch (const Error& e) {
      result.client_error = std::string(error_kind_name(e.kind())) + ": " + e.what();
    }
  });
  tcp::Expected expected{0, 2, "world", server_token};
  result.accepted =
      tcp::server_handshake(server.get(), expected, {}, Deadline(10s), &result.refusal);
  t.join();
  return result;
}

TEST(SecurityHandshake, TokensMustMatchAndNeitherSideSendsIt) {
  HandshakeResult ok = run_handshake("same", "same");
  ASSERT_TRUE(ok.accepted.has_value()) << ok.refusal;
  EXPECT_EQ(ok.accepted->from_rank, 1);
  EXPECT_EQ(ok.client_error, "");

  for (auto [client_token, server_token] : {std::pair<std::string, std::string>{"a", "b"},
                                            {"", "b"},
                                            {"a", ""}}) {
    HandshakeResult bad = run_handshake(client_token, server_token);
    EXPECT_FALSE(bad.accepted.has_value());
    EXPECT_EQ(bad.refusal, "job token differs (CHORUS_JOB_TOKEN)");
    EXPECT_TRUE(contains(bad.client_error,
                         "peer failure: rank 1 connecting to rank 0 (host h): the peer refused the "
                         "connection: job token differs (CHORUS_JOB_TOKEN)"))
        << bad.client_error;
  }
}

// A listener that records what a connecting rank sends, then either refuses or
// answers with a proof it cannot know.
TEST(SecurityHandshake, TokenIsNeverOnTheWireAndAnImpostorIsRefused) {
  const std::string token = "tok-5d2e-data-never-sent";
  for (bool impostor_accepts : {false, true}) {
    auto [client, server] = socket_pair();
    Bytes recorded;
    tcp::Hello hello = hello_for(2, 1, 3, "world");
    std::thread listener([&, fd = server.get()] {
      try {
        auto m = tcp::read_message(fd, Deadline(10s), "recorder");
        recorded.insert(recorded.end(), m.begin(), m.end());
        tcp::Challenge challenge;
        challenge.nonce = auth::make_nonce();
        tcp::send_message(fd, tcp::encode_challenge(challenge), Deadline(10s), "recorder");
        m = tcp::read_message(fd, Deadline(10s), "recorder");
        recorded.insert(recorded.end(), m.begin(), m.end());
        tcp::ProofMessage proof;
        std::string reason;
        EXPECT_TRUE(tcp::decode_proof(m, &proof, &reason)) << reason;
        // The proof is the HMAC the protocol says, over both nonces.
        std::string context = tcp::proof_context("world", 2, 1, 3);
        EXPECT_TRUE(auth::same_proof(
            proof.proof,
            auth::prove(token, context, auth::Role::kClient, hello.nonce, challenge.nonce)));
        tcp::Verdict verdict;
        verdict.accepted = impostor_accepts;  // with an all-zero proof
        verdict.refusal = "recorded";
        tcp::send_message(fd, tcp::encode_verdict(verdict), Deadline(10s), "recorder");
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
      }
    });
    std::string message = error_of<PeerError>([&, fd = client.get()] {
      tcp::client_handshake(fd, hello, token, Deadline(10s), "rank 2 connecting to rank 1");
    });
    listener.join();
    ASSERT_GT(recorded.size(), 2 * tcp::kHeaderBytes + auth::kNonceBytes);
    EXPECT_TRUE(contains_bytes(recorded, "world")) << "the recorder saw no hello";
    EXPECT_FALSE(contains_bytes(recorded, token));
    EXPECT_FALSE(contains_bytes(recorded, token.substr(0, 8)));
    if (impostor_accepts) {
      EXPECT_TRUE(contains(message, "the peer could not prove it holds the job token")) << message;
    } else {
      EXPECT_TRUE(contains(message, "refused the connection: recorded")) << message;
    }
  }
}

// ---- Whole meshes and communicators ----

tcp::TcpOptions mesh_options(const std::string& token, std::chrono::milliseconds timeout = 30s) {
  tcp::TcpOptions o;
  o.listen_address = kLoopback;
  o.comm_id = "security";
  o.token = token;
  o.connect_timeout = timeout;
  o.allowlist = std::make_shared<const net::AllowList>();
  return o;
}

// Rank 0's published address, once it has published it.
std::pair<std::string, uint16_t> published_address(Store& store) {
  int size = 0;
  transport::Member m = transport::decode_member(store.get(transport::member_key(0)), 0, &size);
  return {m.ip, m.port};
}

// Both ranks exchange a message, which opens their streams (connections by use).
void exchange_both(transport::Transport& t0, transport::Transport& t1) {
  auto other = std::async(std::launch::async, [&] { test::exchange_with_every_peer(t1); });
  test::exchange_with_every_peer(t0);
  other.get();
}

TEST(SecurityMesh, BadConnectionsAreRefusedAndTheMeshStillForms) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  testing::internal::CaptureStderr();
  auto rank0 = std::async(std::launch::async,
                          [&] { return tcp::connect_mesh(*store, 0, 2, mesh_options("t")); });
  auto [ip, port] = published_address(*store);
  ASSERT_EQ(ip, kLoopback);
  // Rank 0 accepts from the moment it listens, before every rank has published its
  // address: garbage and a would-be rank 1 with the wrong token are refused before the
  // real rank 1 starts.
  net::Fd garbage = net::connect_to(ip, port, Deadline(10s), "garbage");
  std::string junk(64, 'x');
  send_bytes(garbage.get(), Bytes(junk.begin(), junk.end()));
  net::Fd wrong = net::connect_to(ip, port, Deadline(10s), "wrong token");
  auto wrong_message = std::async(std::launch::async, [&] {
    return error_of<PeerError>([&] {
      tcp::client_handshake(wrong.get(), hello_for(1, 0, 2, "security"), "not-t",
                            Deadline(30s), "impostor");
    });
  });
  EXPECT_TRUE(closed_by_peer(garbage.get(), 30s));
  ASSERT_EQ(wrong_message.wait_for(60s), std::future_status::ready);
  auto rank1 = std::async(std::launch::async,
                          [&] { return tcp::connect_mesh(*store, 1, 2, mesh_options("t")); });
  ASSERT_EQ(rank0.wait_for(60s), std::future_status::ready);
  ASSERT_EQ(rank1.wait_for(60s), std::future_status::ready);
  std::string log = testing::internal::GetCapturedStderr();
  auto t0 = rank0.get();
  auto t1 = rank1.get();
  EXPECT_EQ(t0->size(), 2);
  EXPECT_EQ(t1->rank(), 1);
  exchange_both(*t0, *t1);
  std::string wrong_text = wrong_message.get();
  EXPECT_TRUE(contains(wrong_text, "job token differs (CHORUS_JOB_TOKEN)")) << wrong_text;
  if (warnings_logged()) {
    EXPECT_TRUE(contains(log, "rank 0 refused connection from " +
                                  net::local_address(garbage.get()).str() +
                                  ": handshake: reading the hello: not a chorus peer"))
        << log;
    EXPECT_TRUE(contains(log, "rank 0 refused connection from " +
                                  net::local_address(wrong.get()).str() +
                                  ": job token differs (CHORUS_JOB_TOKEN)"))
        << log;
  }
  t0->close();
  t1->close();
}

TEST(SecurityMesh, AllowListRefusesOtherAddressesOnDataConnections) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  tcp::TcpOptions options = mesh_options("t");
  options.allowlist = std::make_shared<const net::AllowList>(
      net::AllowList::parse("127.0.0.1\n", "data.allow (CHORUS_WHITELIST_FILE)"));
  testing::internal::CaptureStderr();
  auto rank0 =
      std::async(std::launch::async, [&] { return tcp::connect_mesh(*store, 0, 2, options); });
  auto [ip, port] = published_address(*store);
  // Refused before rank 1 starts (see the test above).
  net::Fd outsider = connect_from("127.0.0.2", port);
  auto outsider_message = std::async(std::launch::async, [&] {
    return error_of<PeerError>([&] {
      tcp::client_handshake(outsider.get(), hello_for(1, 0, 2, "security"), "t", Deadline(30s),
                            "outsider");
    });
  });
  ASSERT_EQ(outsider_message.wait_for(60s), std::future_status::ready);
  auto rank1 =
      std::async(std::launch::async, [&] { return tcp::connect_mesh(*store, 1, 2, options); });
  ASSERT_EQ(rank0.wait_for(60s), std::future_status::ready);
  ASSERT_EQ(rank1.wait_for(60s), std::future_status::ready);
  std::string message = outsider_message.get();
  auto t0 = rank0.get();
  auto t1 = rank1.get();
  exchange_both(*t0, *t1);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(message, "address 127.0.0.2 is not in the allow-list data.allow"))
      << message;
  if (warnings_logged()) {
    EXPECT_TRUE(contains(log, "rank 0 refused connection from 127.0.0.2:")) << log;
  }
  t0->close();
  t1->close();
}

TEST(SecurityMesh, RankOutsideTheAllowListFailsClearlyWithoutHanging) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  tcp::TcpOptions options = mesh_options("t", 3s);
  options.allowlist = std::make_shared<const net::AllowList>(
      net::AllowList::parse("127.0.0.2\n", "other.allow"));
  const auto start = Clock::now();
  auto errors = test::run_threads(2, [&](int rank) {
    std::unique_ptr<transport::Transport> t = tcp::connect_mesh(*store, rank, 2, options);
    test::exchange_with_every_peer(*t, 0, 3s);
  }, std::chrono::seconds(60));
  EXPECT_LT(Clock::now() - start, 20s);
  std::string rank0 = test::describe(errors[0]), rank1 = test::describe(errors[1]);
  EXPECT_TRUE(contains(rank1, "rank 1 connecting to rank 0")) << rank1;
  EXPECT_TRUE(contains(rank1, "address 127.0.0.1 is not in the allow-list other.allow")) << rank1;
  // Rank 1 refuses rank 0 too, or has given up saying why; or rank 0 found its port
  // closed and timed out, naming the connection it refused itself.
  EXPECT_TRUE(contains(rank0, "rank 0 connecting to rank 1")) << rank0;
  EXPECT_TRUE(contains(rank0, "not in the allow-list")) << rank0;
}

}  // namespace
}  // namespace chorus
