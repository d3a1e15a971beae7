// The tcp transport's settings for streams between ranks of one host
// (tcp::tune_loopback_stream, mesh.cc): which sockets count as such (net::same_host)
// and what the sending side of one gets, congestion control reno and a fixed send
// buffer. Sockets to other hosts, and sockets that are not inet streams, keep the
// kernel's choices.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "chorus/error.h"
#include "comm/common/deadline.h"
#include "comm/common/socket.h"
#include "comm/transport/tcp/tcp_transport.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
namespace tcp = transport::tcp;

// What mesh.cc asks the kernel for (kLoopbackSendBuffer).
constexpr int kAskedSendBuffer = 512 * 1024;

// A connected pair over `host`: the connecting end and the accepted one.
std::pair<net::Fd, net::Fd> connected_pair(const std::string& host) {
  net::Fd listener = net::listen_on(host, 0);
  const uint16_t port = net::local_address(listener.get()).port();
  const Deadline deadline(10s);
  net::Fd client = net::connect_to(host, port, deadline, "test client");
  net::Fd server = net::accept_before(listener.get(), deadline, nullptr);
  if (!server.valid()) throw TimeoutError("test: no connection accepted on " + host);
  return {std::move(client), std::move(server)};
}

std::string congestion_of(int fd) {
  char name[32] = {0};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

int send_buffer_of(int fd) {
  int bytes = 0;
  socklen_t len = sizeof bytes;
  getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &len);
  return bytes;
}

// A line of /proc/sys, empty where it cannot be read.
std::string proc_sys(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool reno_allowed() {
  std::istringstream names(proc_sys("/proc/sys/net/ipv4/tcp_allowed_congestion_control"));
  std::string name;
  while (names >> name) {
    if (name == "reno") return true;
  }
  return false;
}

TEST(TcpLoopback, StreamsOverLoopbackAreSameHost) {
  auto [client, server] = connected_pair("127.0.0.1");
  EXPECT_TRUE(net::same_host(client.get()));
  EXPECT_TRUE(net::same_host(server.get()));
}

TEST(TcpLoopback, StreamsOverIpv6LoopbackAreSameHost) {
  std::pair<net::Fd, net::Fd> pair;
  try {
    pair = connected_pair("::1");
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  EXPECT_TRUE(net::same_host(pair.first.get()));
  EXPECT_TRUE(net::same_host(pair.second.get()));
}

TEST(TcpLoopback, OtherSocketsAreNotSameHost) {
  int unix_pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair), 0) << std::strerror(errno);
  net::Fd a(unix_pair[0]), b(unix_pair[1]);
  EXPECT_FALSE(net::same_host(a.get())) << "a unix socket";
  net::Fd unconnected(::socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_TRUE(unconnected.valid());
  EXPECT_FALSE(net::same_host(unconnected.get())) << "an unconnected inet socket";
  EXPECT_FALSE(net::same_host(-1)) << "no socket at all";
}

TEST(TcpLoopback, TuningSetsRenoAndAFixedSendBuffer) {
  auto [client, server] = connected_pair("127.0.0.1");
  const std::string before = congestion_of(client.get());
  ASSERT_TRUE(tcp::tune_loopback_stream(client.get()));
  // The kernel takes a requested send buffer up to net.core.wmem_max and doubles it
  // (socket(7)).
  const std::string wmem_max = proc_sys("/proc/sys/net/core/wmem_max");
  ASSERT_FALSE(wmem_max.empty());
  const int expected = 2 * std::min(kAskedSendBuffer, std::stoi(wmem_max));
  EXPECT_EQ(send_buffer_of(client.get()), expected);
  if (reno_allowed()) {
    EXPECT_EQ(congestion_of(client.get()), "reno");
  } else {
    EXPECT_EQ(congestion_of(client.get()), before) << "reno is not allowed here";
  }
  // The stream still carries bytes both ways.
  const Deadline deadline(10s);
  const std::string ping = "ping", pong = "pong";
  net::write_full(client.get(), ping.data(), ping.size(), deadline, "test");
  std::string got(ping.size(), '\0');
  net::read_full(server.get(), got.data(), got.size(), deadline, "test");
  EXPECT_EQ(got, ping);
  net::write_full(server.get(), pong.data(), pong.size(), deadline, "test");
  net::read_full(client.get(), got.data(), got.size(), deadline, "test");
  EXPECT_EQ(got, pong);
}

TEST(TcpLoopback, TuningLeavesOtherSocketsAsTheyAre) {
  int unix_pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair), 0) << std::strerror(errno);
  net::Fd a(unix_pair[0]), b(unix_pair[1]);
  const int before = send_buffer_of(a.get());
  EXPECT_FALSE(tcp::tune_loopback_stream(a.get()));
  EXPECT_EQ(send_buffer_of(a.get()), before);
  net::Fd unconnected(::socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_TRUE(unconnected.valid());
  const std::string congestion = congestion_of(unconnected.get());
  const int buffer = send_buffer_of(unconnected.get());
  EXPECT_FALSE(tcp::tune_loopback_stream(unconnected.get()));
  EXPECT_EQ(congestion_of(unconnected.get()), congestion);
  EXPECT_EQ(send_buffer_of(unconnected.get()), buffer);
}

}  // namespace
}  // namespace chorus
