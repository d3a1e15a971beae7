// Security primitives of the common layer (docs/security.md): the challenge-response
// proofs of the job token (comm/common/auth.h), the one handshake flow both protocols
// run (comm/common/handshake.h) and the allow-list of peer addresses
// (comm/common/allowlist.h: CHORUS_WHITELIST_FILE, HCCL_WHITELIST_FILE,
// HCCL_WHITELIST_DISABLE). Where each is enforced is tested with its layer:
// store/store_auth_test.cc, transport/handshake_test.cc, communicator/job_token_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/handshake.h"
#include "comm/common/wire.h"
#include "util/checks.h"
#include "util/security.h"

namespace chorus {
namespace {

using test::contains;
using test::error_of;
using test::SecurityAllowListEnv;
using test::TempFile;

TEST(SecurityAuth, ProofsDependOnTokenRoleNoncesAndContext) {
  auth::Nonce a = auth::make_nonce(), b = auth::make_nonce();
  EXPECT_NE(a, b) << "two nonces from the random generator are equal";
  auth::Proof p = auth::prove("token", "ctx", auth::Role::kClient, a, b);
  EXPECT_TRUE(auth::same_proof(p, auth::prove("token", "ctx", auth::Role::kClient, a, b)));
  EXPECT_FALSE(auth::same_proof(p, auth::prove("tokem", "ctx", auth::Role::kClient, a, b)));
  EXPECT_FALSE(auth::same_proof(p, auth::prove("", "ctx", auth::Role::kClient, a, b)));
  EXPECT_FALSE(auth::same_proof(p, auth::prove("token", "ctx", auth::Role::kServer, a, b)));
  EXPECT_FALSE(auth::same_proof(p, auth::prove("token", "ctx", auth::Role::kClient, b, a)));
  EXPECT_FALSE(auth::same_proof(p, auth::prove("token", "ctx2", auth::Role::kClient, a, b)));
  // HMAC-SHA256 itself (RFC 4231, test case 2).
  std::string data = "what do ya want for nothing?";
  auth::Proof mac = auth::hmac_sha256("Jefe", reinterpret_cast<const uint8_t*>(data.data()),
                                      data.size());
  const uint8_t expected[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                                0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                                0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_TRUE(std::equal(mac.begin(), mac.end(), expected));
}

// ---- The allow-list ----

// ---- The handshake flow, message by message (no sockets) ----

// A protocol's hook that takes HELLO fields "ok" and refuses anything else.
bool check_fields(std::span<const uint8_t> fields, std::string* context, std::string* why) {
  if (std::string(fields.begin(), fields.end()) != "ok") {
    *why = "field differs";
    return false;
  }
  *context = "test-v1";
  return true;
}

std::vector<uint8_t> ok_fields() { return {'o', 'k'}; }

// Runs the flow between a client with `client_token` and a server with `server_token`;
// returns the client's last step and leaves the server's outcome in `server`.
handshake::Client::Step run_flow(const std::string& client_token, handshake::Server& server,
                                 std::vector<handshake::Kind>* server_said) {
  handshake::Client client(client_token, "test-v1", auth::make_nonce());
  std::vector<handshake::Message> to_server;
  handshake::Client::Step step = handshake::run_client(
      client, ok_fields(), [&](const handshake::Message& m) { to_server.push_back(m); },
      [&] {
        std::optional<handshake::Message> answer = server.take(to_server.back(), check_fields);
        if (!answer) answer = server.accept();
        server_said->push_back(answer->kind);
        return *answer;
      });
  return step;
}

TEST(SecurityHandshakeFlow, BothSidesProveInOrderAndAWrongTokenIsRefused) {
  using handshake::Kind;
  using Outcome = handshake::Client::Outcome;
  handshake::Server good("t");
  std::vector<Kind> said;
  EXPECT_EQ(run_flow("t", good, &said).outcome, Outcome::kAccepted);
  EXPECT_EQ(said, (std::vector<Kind>{Kind::kChallenge, Kind::kAccepted}));
  EXPECT_TRUE(good.accepted());

  // A wrong proof gets no proof of the server's, only the refusal.
  handshake::Server other("other");
  said.clear();
  handshake::Client::Step step = run_flow("t", other, &said);
  EXPECT_EQ(step.outcome, Outcome::kRefused);
  EXPECT_EQ(step.why, auth::kTokenMismatch);
  EXPECT_EQ(said, (std::vector<Kind>{Kind::kChallenge, Kind::kRefused}));
  EXPECT_EQ(other.refusal(), auth::kTokenMismatch);

  // The protocol's hook refuses a HELLO before any challenge; the allow-list's refusal
  // answers the HELLO whatever it says.
  handshake::Server server("t");
  handshake::Message hello = handshake::Client("t", "test-v1", auth::make_nonce()).hello({'n'});
  std::optional<handshake::Message> answer = server.take(hello, check_fields);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->kind, Kind::kRefused);
  EXPECT_EQ(answer->refusal, "field differs");
  handshake::Server refusing = handshake::Server::refusing("address not listed");
  said.clear();
  step = run_flow("t", refusing, &said);
  EXPECT_EQ(step.outcome, Outcome::kRefused);
  EXPECT_EQ(step.why, "address not listed");

  // A server that does not hold the token cannot make the client accept it, and a
  // server may not accept before the client proved.
  handshake::Client client("t", "test-v1", auth::make_nonce());
  handshake::Message challenge;
  challenge.kind = Kind::kChallenge;
  challenge.nonce = auth::make_nonce();
  ASSERT_EQ(client.take(challenge).outcome, Outcome::kSend);
  handshake::Message forged;
  forged.kind = Kind::kAccepted;
  EXPECT_EQ(client.take(forged).outcome, Outcome::kUnproven);
  handshake::Client early("t", "test-v1", auth::make_nonce());
  EXPECT_EQ(early.take(forged).outcome, Outcome::kUnexpected);
  handshake::Server eager("t");
  EXPECT_EQ(eager.accept().kind, Kind::kRefused);
}

TEST(SecurityHandshakeFlow, BodiesRoundTripAndAreBounded) {
  using handshake::Kind;
  handshake::Message hello;
  hello.kind = Kind::kHello;
  hello.fields = {1, 2, 3};
  hello.nonce = auth::make_nonce();
  wire::Writer w;
  handshake::encode_body(hello, w);
  std::vector<uint8_t> body = w.take();
  ASSERT_EQ(body.size(), 4 + 3 + auth::kNonceBytes);
  handshake::Message back;
  wire::Reader in(body);
  handshake::decode_body(Kind::kHello, in, &back);
  std::string reason;
  ASSERT_TRUE(in.finish(&reason)) << reason;
  EXPECT_EQ(back.fields, hello.fields);
  EXPECT_EQ(back.nonce, hello.nonce);
  // Every truncation of a HELLO, hostile fields and a refusal longer than the limit
  // are refused.
  for (size_t n = 0; n < body.size(); ++n) {
    wire::Reader truncated{std::span<const uint8_t>(body).first(n)};
    handshake::decode_body(Kind::kHello, truncated, &back);
    EXPECT_FALSE(truncated.finish(&reason)) << n;
  }
  std::vector<uint8_t> fields_beyond = body;
  fields_beyond[1] = 0x10;  // 4099 bytes of fields
  wire::Reader beyond(fields_beyond);
  handshake::decode_body(Kind::kHello, beyond, &back);
  EXPECT_FALSE(beyond.finish(&reason));
  EXPECT_TRUE(contains(reason, "hello fields of 4099 bytes exceeds the limit of 1536")) << reason;
  std::vector<uint8_t> hostile = {0xff, 0xff, 0xff, 0x7f};
  wire::Reader refusal(hostile);
  handshake::decode_body(Kind::kRefused, refusal, &back);
  EXPECT_FALSE(refusal.finish(&reason));
  EXPECT_TRUE(contains(reason, "exceeds the limit of 1024")) << reason;
}

TEST(SecurityAllowList, ParsesAddressesNetworksAndComments) {
  std::string text =
      "# nodes of the job\n"
      "\n"
      "10.0.0.7\n"
      "  10.0.1.0/24   # rack 1\n"
      "192.168.7.9/16\n"
      "fd00::7\n"
      "2001:db8::/32\n"
      "127.0.0.1\r\n";
  net::AllowList list = net::AllowList::parse(text, "test-list");
  EXPECT_TRUE(list.restricts());
  EXPECT_EQ(list.size(), 6u);
  for (const char* ip : {"10.0.0.7", "10.0.1.0", "10.0.1.255", "192.168.0.1", "192.168.255.3",
                         "fd00::7", "2001:db8:ffff::1", "127.0.0.1", "::ffff:10.0.0.7"}) {
    EXPECT_TRUE(list.allows_ip(ip)) << ip;
  }
  for (const char* ip : {"10.0.0.8", "10.0.2.0", "192.169.0.1", "fd00::8", "2001:db9::1",
                         "127.0.0.2", "::ffff:10.0.0.8", "not-an-ip"}) {
    EXPECT_FALSE(list.allows_ip(ip)) << ip;
  }
  EXPECT_TRUE(net::AllowList().allows_ip("203.0.113.5")) << "no list allows every address";
  EXPECT_FALSE(net::AllowList().restricts());
  // Prefixes of every length, /0 included.
  EXPECT_TRUE(net::AllowList::parse("0.0.0.0/0", "t").allows_ip("198.51.100.1"));
  EXPECT_FALSE(net::AllowList::parse("0.0.0.0/0", "t").allows_ip("::1"));
  EXPECT_TRUE(net::AllowList::parse("10.0.0.128/25", "t").allows_ip("10.0.0.200"));
  EXPECT_FALSE(net::AllowList::parse("10.0.0.128/25", "t").allows_ip("10.0.0.127"));
  EXPECT_TRUE(net::AllowList::parse("10.0.0.1/31", "t").allows_ip("10.0.0.0"));
}

TEST(SecurityAllowList, MalformedLinesNameTheFileAndLine) {
  struct Case {
    std::string text;
    std::string line;
    std::string quoted;
  };
  std::vector<Case> cases = {
      {"10.0.0.1\n10.0.0.300\n", "line 2", "'10.0.0.300'"},
      {"# c\n\n10.0.0.1/33\n", "line 3", "prefix length must be a number from 0 to 32"},
      {"fd00::/129\n", "line 1", "from 0 to 128"},
      {"10.0.0.1/\n", "line 1", "prefix length"},
      {"10.0.0.1/x\n", "line 1", "prefix length"},
      {"node-3.cluster\n", "line 1", "'node-3.cluster' is not an IPv4 or IPv6 address"},
      {"10.0.0.1 10.0.0.2\n", "line 1", "one address or network per line"},
      {"10.0.0.1,10.0.0.2\n", "line 1", "one address or network per line"},
      {"fe80::1%eth0\n", "line 1", "'fe80::1%eth0'"},
  };
  for (const Case& c : cases) {
    std::string message =
        error_of<ConfigError>([&] { net::AllowList::parse(c.text, "/etc/chorus.allow"); });
    EXPECT_TRUE(contains(message, "allow-list /etc/chorus.allow " + c.line)) << message;
    EXPECT_TRUE(contains(message, c.quoted)) << message;
  }
  std::string empty = error_of<ConfigError>([] { net::AllowList::parse("# none\n\n", "f"); });
  EXPECT_TRUE(contains(empty, "allow-list f lists no address")) << empty;
}

TEST(SecurityAllowList, ReadsHcclJson) {
  std::string json =
      "{\n"
      "  \"comment\": {\"nested\": [1, 2.5e3, true, null, \"x\\\"y\"]},\n"
      "  \"host_ip\": [\"10.0.0.7\", \" 10.0.1.0/24 \",\n"
      "              \"fd00::7\"]\n"
      "}\n";
  net::AllowList list = net::AllowList::parse(json, "hccl.json");
  EXPECT_EQ(list.size(), 3u);
  EXPECT_TRUE(list.allows_ip("10.0.1.9"));
  EXPECT_TRUE(list.allows_ip("fd00::7"));
  EXPECT_FALSE(list.allows_ip("10.0.0.8"));

  std::string bad = error_of<ConfigError>([] {
    net::AllowList::parse("{\"host_ip\": [\"10.0.0.7\",\n \"10.0.0.999\"]}", "hccl.json");
  });
  EXPECT_TRUE(contains(bad, "allow-list hccl.json host_ip entry 2: '10.0.0.999'")) << bad;
  std::string missing =
      error_of<ConfigError>([] { net::AllowList::parse("{\"hosts\": []}", "h.json"); });
  EXPECT_TRUE(contains(missing, "allow-list h.json: a JSON allow-list must be an object with "
                                "a \"host_ip\" array"))
      << missing;
  std::string broken =
      error_of<ConfigError>([] { net::AllowList::parse("{\n\"host_ip\": [\"a\"", "h.json"); });
  EXPECT_TRUE(contains(broken, "allow-list h.json is not valid JSON")) << broken;
  EXPECT_TRUE(contains(broken, "line 2")) << broken;
  std::string not_strings =
      error_of<ConfigError>([] { net::AllowList::parse("{\"host_ip\": [7]}", "h.json"); });
  EXPECT_TRUE(contains(not_strings, "host_ip entry 1: 7 is not a string")) << not_strings;
  std::string empty =
      error_of<ConfigError>([] { net::AllowList::parse("{\"host_ip\": []}", "h.json"); });
  EXPECT_TRUE(contains(empty, "lists no address")) << empty;
}

TEST_F(SecurityAllowListEnv, EnvironmentPicksTheFile) {
  TempFile chorus_file("chorus.allow", "127.0.0.1\n");
  TempFile hccl_file("hccl.json", "{\"host_ip\": [\"127.0.0.2\"]}");
  EXPECT_FALSE(net::AllowList::from_env().restricts()) << "no setting: every address";

  env_.set("HCCL_WHITELIST_FILE", hccl_file.path().c_str());
  net::AllowList hccl = net::AllowList::from_env();
  EXPECT_TRUE(hccl.restricts());
  EXPECT_TRUE(hccl.allows_ip("127.0.0.2"));
  EXPECT_FALSE(hccl.allows_ip("127.0.0.1"));
  EXPECT_TRUE(contains(hccl.describe(), "HCCL_WHITELIST_FILE")) << hccl.describe();

  env_.set("HCCL_WHITELIST_DISABLE", "1");
  EXPECT_FALSE(net::AllowList::from_env().restricts()) << "HCCL_WHITELIST_DISABLE=1";
  env_.set("HCCL_WHITELIST_DISABLE", "0");
  EXPECT_TRUE(net::AllowList::from_env().restricts());

  // Our own variable wins over both HCCL ones.
  env_.set("HCCL_WHITELIST_DISABLE", "1").set("CHORUS_WHITELIST_FILE", chorus_file.path().c_str());
  net::AllowList chorus = net::AllowList::from_env();
  EXPECT_TRUE(chorus.allows_ip("127.0.0.1"));
  EXPECT_FALSE(chorus.allows_ip("127.0.0.2"));
  EXPECT_TRUE(contains(chorus.describe(), "CHORUS_WHITELIST_FILE")) << chorus.describe();

  env_.set("CHORUS_WHITELIST_FILE", "/nonexistent/chorus.allow");
  std::string unreadable = error_of<ConfigError>([] { net::AllowList::from_env(); });
  EXPECT_TRUE(contains(unreadable, "/nonexistent/chorus.allow (CHORUS_WHITELIST_FILE)"))
      << unreadable;

  env_.set("CHORUS_WHITELIST_FILE", nullptr).set("HCCL_WHITELIST_FILE", nullptr);
  env_.set("HCCL_WHITELIST_DISABLE", "0");
  std::string no_file = error_of<ConfigError>([] { net::AllowList::from_env(); });
  EXPECT_TRUE(contains(no_file, "HCCL_WHITELIST_DISABLE=0")) << no_file;
  env_.set("HCCL_WHITELIST_DISABLE", "yes");
  std::string bad = error_of<ConfigError>([] { net::AllowList::from_env(); });
  EXPECT_TRUE(contains(bad, "HCCL_WHITELIST_DISABLE='yes'")) << bad;
}

}  // namespace
}  // namespace chorus
