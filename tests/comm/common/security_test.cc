// Security (docs/security.md): the job token authenticates every store and data
// connection by challenge and response without ever being sent; a connection that
// does not prove it, speaks another protocol or stays silent is closed and logged with
// its address and can touch no key; the allow-list of peer addresses
// (CHORUS_WHITELIST_FILE, HCCL_WHITELIST_FILE, HCCL_WHITELIST_DISABLE) refuses other
// addresses on the store and on data connections.
//
// Only loopback addresses are used: 127.0.0.1 and, as a second "host", 127.0.0.2 (a
// client socket bound to it before connecting; all of 127.0.0.0/8 is loopback).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "chorus/chorus.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/store/tcp_store_protocol.h"
#include "util/checks.h"
#include "comm/transport/tcp/handshake.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace tcp = transport::tcp;

const char kLoopback[] = "127.0.0.1";

using chorus::test::contains;

bool contains_bytes(const Bytes& haystack, const std::string& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}

using test::error_of;
using test::eventually;

bool warnings_logged() { return log::enabled(log::kWarn); }

// Sets environment variables for one test and restores them after it.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (auto& [name, old] : saved_) {
      if (old) ::setenv(name.c_str(), old->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  ScopedEnv& set(const std::string& name, const char* value) {
    if (saved_.find(name) == saved_.end()) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) ::setenv(name.c_str(), value, 1);
    else ::unsetenv(name.c_str());
    return *this;
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

class SecurityAllowListEnv : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"CHORUS_WHITELIST_FILE", "HCCL_WHITELIST_FILE", "HCCL_WHITELIST_DISABLE"})
      env_.set(v, nullptr);
  }
  ScopedEnv env_;
};

// A file in the test's temporary directory, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("chorus_security_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// A TCP connection to 127.0.0.1:`port` from `source` (bound before connecting), made
// non-blocking once connected.
net::Fd connect_from(const std::string& source, uint16_t port) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) net::throw_errno("test: socket", errno);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    net::throw_errno("test: bind to " + source, errno);
  }
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(port);
  ::inet_pton(AF_INET, kLoopback, &remote.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
    net::throw_errno("test: connect from " + source, errno);
  }
  net::set_nonblocking(fd.get());
  return fd;
}

void send_bytes(int fd, const Bytes& bytes) {
  net::write_full(fd, bytes.data(), bytes.size(), Deadline(10s), "test send");
}

// True when the peer closes the connection (end of file or reset) within `within`;
// whatever it sends before is read and dropped.
bool closed_by_peer(int fd, std::chrono::milliseconds within) {
  Deadline deadline(within);
  uint8_t buf[4096];
  while (!deadline.expired()) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, deadline.remaining_ms(100));
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

// One store frame's payload (bounded like the server's authentication frames).
Bytes read_store_frame(int fd, Bytes* raw = nullptr) {
  uint8_t prefix[4];
  net::read_full(fd, prefix, 4, Deadline(10s), "test: frame length");
  uint32_t length = store_wire::read_length_prefix(prefix);
  EXPECT_LE(length, store_wire::kMaxAuthFrameBytes);
  Bytes payload(std::min<size_t>(length, store_wire::kMaxAuthFrameBytes));
  net::read_full(fd, payload.data(), payload.size(), Deadline(10s), "test: frame");
  if (raw) {
    raw->insert(raw->end(), prefix, prefix + 4);
    raw->insert(raw->end(), payload.begin(), payload.end());
  }
  return payload;
}

store_wire::AuthMessage read_auth(int fd, Bytes* raw = nullptr) {
  Bytes payload = read_store_frame(fd, raw);
  store_wire::AuthMessage message;
  std::string reason;
  EXPECT_TRUE(store_wire::decode_auth(payload, &message, &reason)) << reason;
  return message;
}

// Every store connection's first message: the server's challenge.
TEST(SecurityStoreProtocol, AuthMessagesRoundTripAndRefuseGarbage) {
  store_wire::AuthMessage proof;
  proof.kind = store_wire::AuthKind::kClientProof;
  proof.nonce = auth::make_nonce();
  proof.proof = auth::prove("t", store_wire::kAuthContext, auth::Role::kClient, proof.nonce,
                            auth::make_nonce());
  Bytes frame = store_wire::encode_auth(proof);
  store_wire::AuthMessage back;
  std::string reason;
  ASSERT_TRUE(store_wire::decode_auth(std::span(frame).subspan(4), &back, &reason)) << reason;
  EXPECT_EQ(back.kind, store_wire::AuthKind::kClientProof);
  EXPECT_EQ(back.nonce, proof.nonce);
  EXPECT_EQ(back.proof, proof.proof);
  // Every truncation is refused.
  for (size_t n = 4; n < frame.size(); ++n) {
    EXPECT_FALSE(store_wire::decode_auth(std::span(frame).subspan(4, n - 4), &back, &reason));
  }
  // A request where the authentication belongs, and a hostile message length.
  store_wire::Request set;
  set.op = store_wire::Op::kSet;
  set.key = "k";
  Bytes request = store_wire::encode_request(set);
  EXPECT_FALSE(store_wire::decode_auth(std::span(request).subspan(4), &back, &reason));
  EXPECT_TRUE(contains(reason, "set request before the authentication")) << reason;
  Bytes refused = {0xA4, 0xff, 0xff, 0xff, 0xff};
  EXPECT_FALSE(store_wire::decode_auth(refused, &back, &reason));
  EXPECT_TRUE(contains(reason, "exceeds the limit")) << reason;
  EXPECT_FALSE(store_wire::check_auth_frame_length(store_wire::kMaxAuthFrameBytes + 1, &reason));
  EXPECT_TRUE(store_wire::check_auth_frame_length(store_wire::kMaxAuthFrameBytes, &reason));
}

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
  store_wire::AuthMessage hello = read_auth(raw.get());
  ASSERT_EQ(hello.kind, store_wire::AuthKind::kServerHello);
  store_wire::AuthMessage proof;
  proof.kind = store_wire::AuthKind::kClientProof;
  proof.nonce = auth::make_nonce();
  proof.proof = auth::prove("wrong", store_wire::kAuthContext, auth::Role::kClient, proof.nonce,
                            hello.nonce);
  Bytes frames = store_wire::encode_auth(proof);
  store_wire::Request set;
  set.op = store_wire::Op::kSet;
  set.key = "stolen";
  set.value = {1, 2, 3};
  Bytes request = store_wire::encode_request(set);
  frames.insert(frames.end(), request.begin(), request.end());
  send_bytes(raw.get(), frames);
  store_wire::AuthMessage answer = read_auth(raw.get());
  bool closed = closed_by_peer(raw.get(), 10s);
  std::string log = testing::internal::GetCapturedStderr();

  EXPECT_TRUE(contains(message, where + " refused this process")) << message;
  EXPECT_TRUE(contains(message, "job token differs (CHORUS_JOB_TOKEN)")) << message;
  EXPECT_EQ(answer.kind, store_wire::AuthKind::kRefused);
  EXPECT_EQ(answer.message, "job token differs (CHORUS_JOB_TOKEN)");
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

  store_wire::Request set;
  set.op = store_wire::Op::kSet;
  set.key = "old";
  set.value = {1};
  net::Fd old = net::connect_to(kLoopback, server.port(), Deadline(10s), "old protocol");
  send_bytes(old.get(), store_wire::encode_request(set));
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

// The client checks the server's proof too: a listener that does not hold the token
// (another job's store, an impostor) is not trusted with a request.
TEST(SecurityStore, ClientRefusesAServerWithoutTheToken) {
  net::Fd listener = net::listen_on(kLoopback, 0);
  uint16_t port = net::local_address(listener.get()).port();
  std::atomic<bool> request_seen{false};
  std::thread impostor([&] {
    net::Fd fd = net::accept_before(listener.get(), Deadline(10s), nullptr);
    if (!fd.valid()) return;
    store_wire::AuthMessage hello;
    hello.kind = store_wire::AuthKind::kServerHello;
    hello.nonce = auth::make_nonce();
    send_bytes(fd.get(), store_wire::encode_auth(hello));
    read_auth(fd.get());
    store_wire::AuthMessage answer;
    answer.kind = store_wire::AuthKind::kServerProof;
    answer.proof = auth::Proof{};  // it cannot compute the right one
    send_bytes(fd.get(), store_wire::encode_auth(answer));
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
    store_wire::AuthMessage hello;
    hello.kind = store_wire::AuthKind::kServerHello;
    hello.nonce = auth::make_nonce();
    send_bytes(fd.get(), store_wire::encode_auth(hello));
    store_wire::AuthMessage proof = read_auth(fd.get(), &from_client);
    store_wire::AuthMessage answer;
    answer.kind = store_wire::AuthKind::kServerProof;
    answer.proof = auth::prove(token, store_wire::kAuthContext, auth::Role::kServer, proof.nonce,
                               hello.nonce);
    send_bytes(fd.get(), store_wire::encode_auth(answer));
    Bytes request;
    read_store_frame(fd.get(), &request);
    from_client.insert(from_client.end(), request.begin(), request.end());
    send_bytes(fd.get(), store_wire::encode_reply(store_wire::Reply{}));
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
  store_wire::AuthMessage hello = read_auth(raw.get(), &from_server);
  store_wire::AuthMessage proof;
  proof.kind = store_wire::AuthKind::kClientProof;
  proof.nonce = auth::make_nonce();
  proof.proof =
      auth::prove(token, store_wire::kAuthContext, auth::Role::kClient, proof.nonce, hello.nonce);
  send_bytes(raw.get(), store_wire::encode_auth(proof));
  EXPECT_EQ(read_auth(raw.get(), &from_server).kind, store_wire::AuthKind::kServerProof);
  EXPECT_FALSE(contains_bytes(from_server, token));
}

// ---- The allow-list ----

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
      [&] { store_wire::authenticate_client(other.get(), "t", Deadline(10s), where); });
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
        [&] { store_wire::authenticate_client(other.get(), "t", Deadline(10s), "store"); });
    EXPECT_TRUE(contains(message, "127.0.0.2 is not in the allow-list")) << message;
    EXPECT_TRUE(contains(message, "HCCL_WHITELIST_FILE")) << message;
  }
  env_.set("HCCL_WHITELIST_DISABLE", "1");
  TcpStoreServer server(kLoopback, 0, options);
  net::Fd other = connect_from("127.0.0.2", server.port());
  store_wire::authenticate_client(other.get(), "t", Deadline(10s), "store");
  store_wire::Request request;
  request.op = store_wire::Op::kNumKeys;
  send_bytes(other.get(), store_wire::encode_request(request));
  Bytes payload = read_store_frame(other.get());
  store_wire::Reply reply;
  std::string reason;
  ASSERT_TRUE(store_wire::decode_reply(payload, &reply, &reason)) << reason;
  EXPECT_EQ(reply.kind, store_wire::ReplyKind::kInteger);
}

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
  size_t id_length_at = tcp::kHeaderBytes + 16;
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
  std::string text = store.get_string("tcp/0");
  std::string ip;
  int port = 0;
  std::istringstream(text) >> ip >> port;
  return {ip, static_cast<uint16_t>(port)};
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
  std::string log = testing::internal::GetCapturedStderr();
  auto t0 = rank0.get();
  auto t1 = rank1.get();
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
    tcp::connect_mesh(*store, rank, 2, options);
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

TEST(SecurityCommunicator, DifferentTokensFailNamingTheVariable) {
  auto store = std::make_shared<InMemoryStore>();
  const auto start = Clock::now();
  auto errors = test::run_threads(2, [&](int rank) {
    CommOptions options = test::test_options();
    options.transport = TransportKind::kTcp;
    options.connect_timeout = 3s;
    options.job_token = rank == 0 ? "" : "a-token";  // one side without a token
    auto comm = Communicator::create(store, rank, 2, options);
    comm->abort("test: connected despite different job tokens");
  }, std::chrono::seconds(60));
  EXPECT_LT(Clock::now() - start, 20s) << "no hang: the connect timeout is 3 s";
  for (int rank = 0; rank < 2; ++rank) {
    std::string text = test::describe(errors[rank]);
    EXPECT_TRUE(contains(text, "CHORUS_JOB_TOKEN")) << "rank " << rank << ": " << text;
    EXPECT_TRUE(contains(text, "rank " + std::to_string(rank))) << text;
  }
  EXPECT_TRUE(contains(test::describe(errors[1]), "peer")) << test::describe(errors[1]);
}

}  // namespace
}  // namespace chorus
