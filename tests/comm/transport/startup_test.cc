// Start-up of the tcp mesh when the world is not as it should be (issue 21): connections
// to a rank's data port that never authenticate hold no rank up, an inconsistent world
// size is named by every rank at once, and a world size the file-descriptor limit
// cannot hold fails before anything is published.
//
// Only loopback addresses are used.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <latch>
#include <regex>
#include <sstream>
#include <thread>

#include "chorus/chorus.h"
#include "comm/common/allowlist.h"
#include "comm/common/auth.h"
#include "comm/common/socket.h"
#include "comm/transport/call_header.h"
#include "comm/transport/tcp/acceptor.h"
#include "comm/transport/tcp/handshake.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "util/checks.h"
#include "util/ranks.h"
#include "util/streams.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace tcp = transport::tcp;

const char kLoopback[] = "127.0.0.1";

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// This process opens several hundred sockets of its own, on top of the ranks' ones.
void raise_descriptor_limit(rlim_t wanted) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GE(limit.rlim_cur, wanted) << "RLIMIT_NOFILE's hard limit is too low for this test";
}

tcp::TcpOptions mesh_options(std::chrono::milliseconds connect_timeout) {
  tcp::TcpOptions o;
  o.listen_address = kLoopback;
  o.comm_id = "startup";
  o.token = "startup-token";
  o.connect_timeout = connect_timeout;
  o.allowlist = std::make_shared<const net::AllowList>();
  return o;
}

using test::published_port;

// Connections to a rank's data port that never complete a handshake: silent ones, slow
// ones that send a byte of a HELLO every 2 s, and impostors that send a whole HELLO in
// the name of a rank that has not started yet and then nothing (they lack the token).
class Loiterers {
 public:
  ~Loiterers() { stop(); }

  void open(uint16_t port, int to_rank, int claimed_rank, int size, int silent, int slow,
            int impostors) {
    tcp::Hello hello;
    hello.from_rank = claimed_rank;
    hello.to_rank = to_rank;
    hello.size = size;
    hello.comm_id = "startup";
    std::vector<uint8_t> hello_bytes = tcp::encode_hello(hello);
    std::vector<net::Fd>& fds = by_port_[port];
    for (int i = 0; i < silent + slow + impostors; ++i) {
      net::Fd fd = net::connect_to(kLoopback, port, Deadline(10s), "loiterer");
      if (i >= silent + slow) {
        tcp::send_message(fd.get(), hello_bytes, Deadline(10s), "impostor");
      } else if (i >= silent) {
        std::lock_guard<std::mutex> lock(mutex_);
        slow_.push_back({fd.get(), hello_bytes, 0});
      }
      fds.push_back(std::move(fd));
    }
    if (!dribbler_.joinable()) dribbler_ = std::thread([this] { dribble(); });
  }

  int opened(uint16_t port) { return static_cast<int>(by_port_[port].size()); }

  // How many of the connections to `port` the rank has closed or answered (a refusal).
  int dismissed(uint16_t port) {
    int n = 0;
    for (const net::Fd& fd : by_port_[port]) {
      char byte;
      ssize_t got = ::recv(fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) ++n;
    }
    return n;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (dribbler_.joinable()) dribbler_.join();
  }

 private:
  struct Slow {
    int fd;
    std::vector<uint8_t> bytes;
    size_t sent;
  };

  void dribble() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, 2s, [&] { return stopping_; })) {
      for (Slow& s : slow_) {
        if (s.sent == s.bytes.size()) continue;
        ssize_t n = ::send(s.fd, s.bytes.data() + s.sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == 1) ++s.sent;
      }
    }
  }

  std::map<uint16_t, std::vector<net::Fd>> by_port_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Slow> slow_;
  std::thread dribbler_;
};

// The reproduction, harder: before the last rank starts, hundreds of
// connections that will never authenticate are opened to every data port already
// published. One silent connection alone held the old acceptor, which handshook one
// connection at a time, for 10 s; the group must form within a connect timeout of 8 s.
TEST(StartupMesh, ConnectionsThatNeverAuthenticateHoldNoRankUp) {
  raise_descriptor_limit(4096);
  constexpr int kSize = 3;
  constexpr int kSilent = 300, kSlow = 4, kImpostors = 16;
  const auto connect_timeout = 8s;
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  Loiterers loiterers;
  std::vector<std::unique_ptr<transport::Transport>> meshes(kSize);
  std::vector<Clock::time_point> formed(kSize);
  Clock::time_point arrival;
  auto errors = test::run_threads(kSize, [&](int rank) {
    if (rank == kSize - 1) {
      for (int r = 0; r < kSize - 1; ++r) {
        loiterers.open(published_port(*store, r), r, kSize - 1, kSize, kSilent, kSlow,
                       kImpostors);
      }
      arrival = Clock::now();
    }
    meshes[rank] = tcp::connect_mesh(*store, rank, kSize, mesh_options(connect_timeout));
    // Connections by use: the first exchange opens every stream.
    test::exchange_with_every_peer(*meshes[rank], 0, connect_timeout);
    formed[rank] = Clock::now();
  }, 120s);
  loiterers.stop();
  test::rethrow_rank_failures(errors);
  Clock::time_point last = *std::max_element(formed.begin(), formed.end());
  std::printf("[ startup  ] %d ranks formed %.1f ms after the last one arrived, with %d silent, "
              "%d slow and %d impostor connections to each of the other ranks' data ports "
              "(connect timeout %lld s)\n",
              kSize, ms_between(arrival, last), kSilent, kSlow, kImpostors,
              static_cast<long long>(connect_timeout.count()));
  for (auto& mesh : meshes) mesh->close();
}

// A flood of connections to a data port is held to a bound, oldest closed first, so
// that it cannot use up the rank's descriptors; the group still forms.
TEST(StartupMesh, AFloodOfConnectionsIsHeldToABound) {
  raise_descriptor_limit(4096);
  constexpr int kFlood = 1000;
  constexpr int kHeld = tcp::kMaxUnauthenticated;
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  Loiterers loiterers;
  std::vector<std::unique_ptr<transport::Transport>> meshes(2);
  auto errors = test::run_threads(2, [&](int rank) {
    if (rank == 1) {
      uint16_t port = published_port(*store, 0);
      loiterers.open(port, 0, 1, 2, kFlood, 0, 0);
      EXPECT_TRUE(test::eventually([&] { return loiterers.dismissed(port) >= kFlood - kHeld; },
                                   5s))
          << "rank 0 closed " << loiterers.dismissed(port) << " of the " << kFlood
          << " connections that never authenticated; it may hold at most " << kHeld;
      std::printf("[ startup  ] rank 0 closed %d of %d silent connections to its data port\n",
                  loiterers.dismissed(port), kFlood);
    }
    meshes[rank] = tcp::connect_mesh(*store, rank, 2, mesh_options(30s));
    test::exchange_with_every_peer(*meshes[rank]);
  }, 120s);
  loiterers.stop();
  test::rethrow_rank_failures(errors);
  for (auto& mesh : meshes) mesh->close();
}

// A HELLO in a rank's name takes nothing: the rank's place goes to the first connection
// that proves the token, and a second one that proves it too is refused as a duplicate.
TEST(StartupMesh, ARankIsTakenWhenItAuthenticatesNotWhenItIsClaimed) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  auto rank0 = std::async(std::launch::async, [&] {
    return test::error_of<TimeoutError>(
        [&] { tcp::connect_mesh(*store, 0, 3, mesh_options(3s)); });
  });
  uint16_t port = published_port(*store, 0);
  auto hello_from_1 = [] {
    tcp::Hello h;
    h.from_rank = 1;
    h.to_rank = 0;
    h.size = 3;
    h.comm_id = "startup";
    h.nonce = auth::make_nonce();
    return h;
  };
  // An impostor claims rank 1, gets its challenge, and goes no further.
  net::Fd impostor = net::connect_to(kLoopback, port, Deadline(10s), "impostor");
  tcp::send_message(impostor.get(), tcp::encode_hello(hello_from_1()), Deadline(10s), "impostor");
  std::vector<uint8_t> challenge = tcp::read_message(impostor.get(), Deadline(10s), "impostor");
  EXPECT_EQ(tcp::kind_of(challenge), tcp::MessageKind::kChallenge);
  // Rank 1, which holds the token, is accepted all the same...
  net::Fd real = net::connect_to(kLoopback, port, Deadline(10s), "rank 1");
  EXPECT_NO_THROW(tcp::client_handshake(real.get(), hello_from_1(), "startup-token",
                                        Deadline(10s), "rank 1 connecting to rank 0"));
  // ...and a second connection in its name, token and all, is refused.
  net::Fd second = net::connect_to(kLoopback, port, Deadline(10s), "second rank 1");
  std::string refused = test::error_of<PeerError>([&] {
    tcp::client_handshake(second.get(), hello_from_1(), "startup-token", Deadline(10s),
                          "a second rank 1");
  });
  EXPECT_NE(refused.find("the peer refused the connection: duplicate connection from rank 1"),
            std::string::npos)
      << refused;
  // Ranks 1 and 2 never published their addresses (this "rank 1" is the test's).
  ASSERT_EQ(rank0.wait_for(60s), std::future_status::ready);
  std::string timeout = rank0.get();
  EXPECT_NE(timeout.find("not every rank published its address"), std::string::npos) << timeout;
}

// A rank whose peer never connects names the address it published, where the peer was
// to reach it: a wrong interface makes that rank time out first as often as not, and
// then its message is the only one that can name the address.
TEST(StartupMesh, ARankNobodyReachesNamesTheAddressItPublished) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  std::latch rank0_done(1);
  auto errors = test::run_threads(2, [&](int rank) {
    std::unique_ptr<transport::Transport> t = tcp::connect_mesh(*store, rank, 2, mesh_options(30s));
    if (rank == 1) {
      rank0_done.wait();
      return;
    }
    const std::string at = "127.0.0.1:" + std::to_string(published_port(*store, 0));
    t->begin(transport::collective_op("broadcast", 0, DataType::kUInt8, false, ReduceOp::kSum, 1,
                                      1, Deadline(1s)));
    uint8_t byte = 0;
    t->irecv(1, &byte, 1);
    std::string timeout = test::error_of<TimeoutError>([&] { t->wait_all(); });
    rank0_done.count_down();
    EXPECT_NE(timeout.find("it never connected to this rank, on " + at +
                           ", the address this rank published"),
              std::string::npos)
        << timeout;
  }, 60s);
  test::rethrow_rank_failures(errors);
}

// ---- An inconsistent world size ----

struct SizeMismatch {
  int rank_a, size_a, rank_b, size_b;
};

// "world size differs: rank A was created with size X, rank B with size Y".
std::optional<SizeMismatch> parse_mismatch(const std::string& message) {
  static const std::regex pattern(
      "world size differs: rank ([0-9]+) was created with size ([0-9]+), rank ([0-9]+) with "
      "size ([0-9]+)");
  std::smatch m;
  if (!std::regex_search(message, m, pattern)) return std::nullopt;
  return SizeMismatch{std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4])};
}

// Every rank fails at once, naming both sizes and the ranks that hold them, wherever
// the odd size is and whichever rank arrives first; with a connect timeout of 30 s, a
// rank that waits instead is an obvious failure.
TEST(StartupMesh, InconsistentWorldSizeIsNamedByEveryRankAtOnce) {
  const std::vector<std::vector<int>> assignments = {
      {3, 3, 4}, {4, 3, 3}, {2, 3, 3}, {3, 2, 3}, {3, 4, 4}};
  for (const std::vector<int>& sizes : assignments) {
    for (bool last_first : {false, true}) {
      const int ranks = static_cast<int>(sizes.size());
      std::string label = "sizes";
      for (int s : sizes) label += " " + std::to_string(s);
      label += last_first ? ", the last rank first" : ", rank 0 first";
      SCOPED_TRACE(label);
      auto store = std::make_shared<InMemoryStore>();
      const auto start = Clock::now();
      auto errors = test::run_threads(ranks, [&](int rank) {
        // Staggered, so that a known rank is the first to arrive.
        int place = last_first ? ranks - 1 - rank : rank;
        std::this_thread::sleep_for(place * 100ms);
        CommOptions options = test::test_options();
        options.transport = TransportKind::kTcp;
        options.connect_timeout = 30s;
        options.comm_id = "startup";
        Communicator::create(store, rank, sizes[rank], options)->abort("test: connected");
      }, 120s);
      double elapsed_ms = ms_between(start, Clock::now());
      std::printf("[ startup  ] %s: every rank failed within %.0f ms\n", label.c_str(),
                  elapsed_ms);
      ASSERT_LT(elapsed_ms, 10000) << "a rank waited for its connect timeout";
      for (int rank = 0; rank < ranks; ++rank) {
        std::string text = test::describe(errors[rank]);
        EXPECT_NE(text.find("(configuration)"), std::string::npos) << "rank " << rank << ": "
                                                                    << text;
        EXPECT_NE(text.find("rank " + std::to_string(rank) + " of " + std::to_string(sizes[rank])),
                  std::string::npos)
            << text;
        std::optional<SizeMismatch> m = parse_mismatch(text);
        ASSERT_TRUE(m.has_value()) << "rank " << rank << ": " << text;
        EXPECT_EQ(sizes.at(m->rank_a), m->size_a) << text;
        EXPECT_EQ(sizes.at(m->rank_b), m->size_b) << text;
        EXPECT_NE(m->size_a, m->size_b) << text;
      }
    }
  }
}

// ---- Limits ----

// Lowers RLIMIT_NOFILE in a death test's child.
void set_descriptor_limit(rlim_t soft, rlim_t hard) {
  rlimit limit{soft, hard};
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::perror("setrlimit");
    std::_Exit(10);
  }
}

CommOptions tcp_options(std::chrono::milliseconds connect_timeout) {
  CommOptions options = test::test_options();
  options.transport = TransportKind::kTcp;
  options.connect_timeout = connect_timeout;
  return options;
}

// Streams open by use, so a rank needs descriptors for the peers its algorithms use
// (a few dozen at most for the collectives, every peer for an alltoall), not for the
// world. Creation asks for the streams of 64 peers at least: under a limit of 256 a
// rank of WORLD_SIZE=100000 says so at once, before it publishes anything.
TEST(StartupLimitsDeathTest, WorldSizeBeyondTheDescriptorLimitFailsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_descriptor_limit(256, 256);
        auto store = std::make_shared<InMemoryStore>();
        const auto start = Clock::now();
        try {
          Communicator::create(store, 0, 100000, tcp_options(30s));
          std::fprintf(stderr, "created a communicator of 100000 ranks alone\n");
          std::_Exit(1);
        } catch (const ConfigError& e) {
          std::fprintf(stderr, "%s\n", e.what());
          if (store->num_keys() != 0) {
            std::fprintf(stderr, "but published %lld keys first\n",
                         static_cast<long long>(store->num_keys()));
            std::_Exit(2);
          }
          if (Clock::now() - start > 5s) std::_Exit(3);
          std::_Exit(0);
        } catch (const Error& e) {
          std::fprintf(stderr, "%s: %s\n", error_kind_name(e.kind()), e.what());
          std::_Exit(4);
        }
      },
      testing::ExitedWithCode(0),
      "world size 100000 needs at least [0-9]+ file descriptors.*RLIMIT_NOFILE.* 256.*ulimit -n");
}

// Where the hard limit is enough, the soft one is raised to it, as servers do.
TEST(StartupLimitsDeathTest, SoftDescriptorLimitIsRaisedWhenTheHardOneIsEnough) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_descriptor_limit(1024, 4096);
        auto store = std::make_shared<InMemoryStore>();
        try {
          // 1000 ranks take about 2300 descriptors when every peer is used; the other 999
          // never come.
          Communicator::create(store, 0, 1000, tcp_options(500ms));
          std::_Exit(1);
        } catch (const TimeoutError& e) {
          std::fprintf(stderr, "%s\n", e.what());
        } catch (const Error& e) {
          std::fprintf(stderr, "%s: %s\n", error_kind_name(e.kind()), e.what());
          std::_Exit(2);
        }
        rlimit limit{};
        ::getrlimit(RLIMIT_NOFILE, &limit);
        std::fprintf(stderr, "soft limit %llu, hard limit %llu\n",
                     static_cast<unsigned long long>(limit.rlim_cur),
                     static_cast<unsigned long long>(limit.rlim_max));
        std::_Exit(limit.rlim_cur == 4096 ? 0 : 3);
      },
      // The 999 ranks that never came: the first 16 named, and how many more.
      testing::ExitedWithCode(0),
      "not every rank published its address");
}

}  // namespace
}  // namespace chorus
