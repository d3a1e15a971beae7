// The tcp transport on its own (src/comm/transport/tcp/): connect_mesh over an
// in-memory store, ranks as threads of this process (a forked process where a death
// must be real), world sizes 2 to 5, driven through the Transport interface with no
// communicator above it. What transport.h promises: messages on one stream arrive in
// the order they were posted, however many are in flight, zero-length ones included;
// a receive of another length, or a frame of another call, is a PeerError naming both
// ranks (and, for another call, what each called); a peer that closes, dies or aborts
// is named (with its own reason, when it aborted); a deadline that passes is a
// TimeoutError naming the awaited rank; interrupt() from another thread ends a wait
// promptly with AbortedError. Every message is checked for the operation and its
// sequence number, the ranks, and their hosts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "comm/common/allowlist.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using test::contains;
using test::error_of;
using transport::FrameKind;
using transport::OpInfo;
using transport::Request;
using transport::Signature;
using transport::Transport;
namespace tcp = transport::tcp;

using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "tcp-transport-test-token";

tcp::TcpOptions mesh_options() {
  tcp::TcpOptions o;
  o.listen_address = "127.0.0.1";
  o.comm_id = "tcp-transport-test";
  o.token = kToken;
  o.connect_timeout = 30s;
  o.allowlist = std::make_shared<const net::AllowList>();
  return o;
}

// A collective operation as the communicator would begin it: every rank passes the same
// name, sequence number and signature.
OpInfo collective(const char* name, uint64_t seq, Signature sig = {},
                  std::chrono::milliseconds timeout = 30s) {
  OpInfo op;
  op.name = name;
  op.code = transport::wire_code(parse_collective(name).value());
  op.seq = seq;
  op.kind = FrameKind::kCollective;
  op.deadline = Deadline(timeout);
  op.sig = sig;
  return op;
}

OpInfo p2p(const char* name) {
  OpInfo op = collective(name, 0);
  op.kind = FrameKind::kP2P;
  return op;
}

Signature f32_sum(uint64_t count) {
  return Signature{count, -1, static_cast<uint8_t>(DataType::kFloat32),
                   static_cast<uint8_t>(ReduceOp::kSum)};
}

// "rank R (host H, 127.0.0.1:" : how a message names a peer (its port follows).
std::string peer_text(const Transport& t, int rank) {
  return "rank " + std::to_string(rank) + " (host " + t.host_of(rank) + ", 127.0.0.1:";
}
// "rank R (host H)" : how a message names the rank that reports it.
std::string here_text(const Transport& t) {
  return "rank " + std::to_string(t.rank()) + " (host " + t.host_of(t.rank()) + ")";
}

// Connects `size` ranks, each a thread, over one fresh InMemoryStore and runs body on
// each with its transport, which is closed on that thread when body returns (so that
// the ranks close together). A body that throws interrupts the others, so that none
// waits for it until its deadline; the failures are rethrown as one RankFailure.
void run_mesh(int size, const std::function<void(Transport&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  store->set_timeout(30s);
  std::mutex mu;
  std::vector<Transport*> live(size, nullptr);
  auto errors = test::run_threads(size, [&](int rank) {
    std::unique_ptr<Transport> t = tcp::connect_mesh(*store, rank, size, mesh_options());
    {
      std::lock_guard<std::mutex> lock(mu);
      live[rank] = t.get();
    }
    struct Unlist {
      std::mutex& mu;
      Transport*& slot;
      ~Unlist() {
        std::lock_guard<std::mutex> lock(mu);
        slot = nullptr;
      }
    } unlist{mu, live[rank]};
    ASSERT_EQ(t->rank(), rank);
    ASSERT_EQ(t->size(), size);
    body(*t);
  }, 120s, [&](int failed) {
    std::lock_guard<std::mutex> lock(mu);
    for (int r = 0; r < size; ++r) {
      if (r != failed && live[r] != nullptr) live[r]->interrupt("rank " + std::to_string(failed) + " failed");
    }
  });
  test::rethrow_rank_failures(errors);
}

// Runs `fn`, which must throw E, and aborts `t` with its message as a communicator
// would; returns the message.
template <typename E>
std::string failure_of(Transport& t, const std::function<void()>& fn) {
  std::string message = error_of<E>(fn);
  t.abort(message.empty() ? "the test's call did not fail" : message);
  return message;
}

// The bytes of message `k` from `from` to `to`, `len` of them: different on every
// stream and at every position, so that a message delivered out of order, to the wrong
// buffer or shifted shows.
uint8_t byte_of(int from, int to, size_t k, size_t i) {
  return static_cast<uint8_t>(from * 131 + to * 37 + k * 11 + i * 7 + (i >> 8));
}
std::vector<uint8_t> message(int from, int to, size_t k, size_t len) {
  std::vector<uint8_t> m(len);
  for (size_t i = 0; i < len; ++i) m[i] = byte_of(from, to, k, i);
  return m;
}

// Posts `lengths[k]` bytes to and from every other rank, message k of each stream
// numbered k, waits for all with wait_all() and checks every byte.
void exchange_all(Transport& t, const std::vector<size_t>& lengths) {
  const int me = t.rank(), n = t.size();
  std::vector<std::vector<std::vector<uint8_t>>> out(n), in(n);
  std::vector<Request> requests;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (size_t k = 0; k < lengths.size(); ++k) {
      out[p].push_back(message(me, p, k, lengths[k]));
      // One spare byte, so that a buffer non-empty even at length 0 and a write past the
      // message shows.
      in[p].push_back(std::vector<uint8_t>(lengths[k] + 1, 0xEE));
    }
  }
  // Sends and receives interleaved, stream after stream, as an algorithm posts them.
  for (size_t k = 0; k < lengths.size(); ++k) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      requests.push_back(t.isend(p, out[p][k].data(), lengths[k]));
      requests.push_back(t.irecv(p, in[p][k].data(), lengths[k]));
    }
  }
  t.wait_all();
  for (const Request& r : requests) EXPECT_TRUE(t.test(r));
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (size_t k = 0; k < lengths.size(); ++k) {
      const std::vector<uint8_t> want = message(p, me, k, lengths[k]);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), in[p][k].begin()))
          << "message " << k << " (" << lengths[k] << " bytes) from rank " << p << " to rank " << me;
      ASSERT_EQ(in[p][k][lengths[k]], 0xEE) << "message " << k << " from rank " << p
                                             << " wrote past its " << lengths[k] << " bytes";
    }
  }
}

// Counts `latch` down when it goes out of scope, however the rank's body ends, so that
// the ranks waiting on it are released even when an assertion returns early.
struct CountDownOnExit {
  std::latch& latch;
  ~CountDownOnExit() { latch.count_down(); }
};

class TcpTransportTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(WorldSizes, TcpTransportTest, ::testing::Range(2, 6),
                         [](const auto& info) { return "size" + std::to_string(info.param); });

TEST_P(TcpTransportTest, MessagesOnAStreamArriveInTheOrderPosted) {
  run_mesh(GetParam(), [](Transport& t) {
    // Send/recv frames are numbered per stream; each wait() on one request in reverse
    // order drives the others too.
    const int me = t.rank(), n = t.size();
    constexpr size_t kMessages = 40;
    t.begin(p2p("send"));
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<Request> recvs;
    for (size_t k = 0; k < kMessages; ++k) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        out.push_back(message(me, p, k, 1 + k * 13));
        t.isend(p, out.back().data(), out.back().size());
      }
    }
    in.reserve(kMessages * n);
    for (size_t k = 0; k < kMessages; ++k) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        in.emplace_back(1 + k * 13);
        recvs.push_back(t.irecv(p, in.back().data(), in.back().size()));
      }
    }
    for (auto it = recvs.rbegin(); it != recvs.rend(); ++it) t.wait(*it);
    size_t i = 0;
    for (size_t k = 0; k < kMessages; ++k) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        EXPECT_EQ(in[i], message(p, me, k, 1 + k * 13)) << "message " << k << " from rank " << p;
        ++i;
      }
    }
    t.wait_all();  // the sends
  });
}

TEST_P(TcpTransportTest, ManyPostedSendsAndRecvsCompleteWithWaitAll) {
  // Small and large messages in flight on every stream at once, in both directions:
  // more than the socket buffers hold, so each rank must read while it writes.
  std::vector<size_t> lengths;
  for (size_t k = 0; k < 64; ++k) lengths.push_back(k % 16 == 15 ? (size_t{1} << 20) + k : 3 * k + 1);
  run_mesh(GetParam(), [&](Transport& t) {
    for (uint64_t seq = 0; seq < 3; ++seq) {
      t.begin(collective("alltoall", seq, Signature{lengths.size(), -1, 0, transport::kNoReduce}));
      exchange_all(t, lengths);
    }
  });
}

TEST_P(TcpTransportTest, ZeroLengthMessagesCompleteAndKeepTheStreamInStep) {
  run_mesh(GetParam(), [](Transport& t) {
    t.begin(collective("barrier", 0));
    exchange_all(t, {0, 0, 0});
    t.begin(collective("allgather", 1, f32_sum(1)));
    exchange_all(t, {0, 5, 0, 0, 4096, 0, 1});
  });
}

TEST_P(TcpTransportTest, ReceiveOfAnotherLengthFailsNamingBothRanks) {
  // Rank 0 sends rank 1 eight bytes of allreduce #0; rank 1 expects 16. Rank 1 fails,
  // naming both lengths and rank 0; rank 0, waiting for rank 1, learns rank 1's reason
  // from its abort.
  run_mesh(GetParam(), [](Transport& t) {
    if (t.rank() > 1) return;
    t.begin(collective("allreduce", 0, f32_sum(2)));
    std::vector<uint8_t> buf(16);
    if (t.rank() == 0) {
      t.isend(1, buf.data(), 8);
      t.irecv(1, buf.data(), 16);
      const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
      EXPECT_EQ(m.rfind("allreduce #0 failed on " + here_text(t) + ": ", 0), 0u) << m;
      EXPECT_TRUE(contains(m, peer_text(t, 1))) << m;
      EXPECT_TRUE(contains(m, ") aborted: allreduce #0 failed on rank 1 (host ")) << m;
      EXPECT_TRUE(contains(m, "mismatched message from rank 0 (host ")) << m;
      return;
    }
    t.irecv(0, buf.data(), 16);
    const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
    EXPECT_EQ(m.rfind("allreduce #0 failed on " + here_text(t) + ": ", 0), 0u) << m;
    EXPECT_TRUE(contains(m, "mismatched message from " + peer_text(t, 0))) << m;
    EXPECT_TRUE(contains(m, "expected allreduce #0 with f32 × 2, sum (collective frame of 16 bytes)")) << m;
    EXPECT_TRUE(contains(m, "got allreduce #0 with f32 × 2, sum (collective frame of 8 bytes)")) << m;
  });
}

// "allreduce #0 with f32 × 10, sum" from rank 0, 11 floats from the others.
std::string call_of_rank(int rank) {
  return std::string("allreduce #0 with f32 × ") + (rank == 0 ? "10" : "11") + ", sum";
}

// `m`, reported by `t`'s rank, names a mismatch that a rank Y found with a rank X (Y's
// own, or the reason of Y's abort), saying what each called (call_of_rank).
void expect_mismatch(const Transport& t, const std::string& m) {
  EXPECT_EQ(m.rfind("allreduce #0 failed on " + here_text(t) + ": ", 0), 0u) << m;
  static const std::regex pair(R"(failed on rank (\d+) \(host [^)]*\): mismatch with rank (\d+) \(host )");
  std::smatch found;
  ASSERT_TRUE(std::regex_search(m, found, pair)) << m;
  const int y = std::stoi(found[1]), x = std::stoi(found[2]);
  EXPECT_TRUE(contains(m, "mismatch with " + peer_text(t, x))) << m;
  EXPECT_TRUE(contains(m, "rank " + std::to_string(x) + " called " + call_of_rank(x) +
                              "; this rank called " + call_of_rank(y) + " (")) << m;
  EXPECT_NE(call_of_rank(x), call_of_rank(y)) << m;
}

TEST_P(TcpTransportTest, CallOfAnotherSignatureFailsWithTheMismatch) {
  // Every rank sends 40 bytes of allreduce #0 to the next rank and receives from the one
  // before; rank 0 calls it with 10 floats, the others with 11. Each rank's send is out
  // before it posts its receive, so rank 1, whose first frame from rank 0 is rank 0's
  // data, always fails naming both calls. Rank 0 fails too: on rank n-1's data, or on
  // rank 1's abort when that comes first; then its message holds rank 1's. Any other
  // rank completes, or fails with the reason of an abort that came before its data or
  // before its own send was through (connections by use: a send to a rank that aborted
  // already, made on first use, reads that rank's reason).
  run_mesh(GetParam(), [](Transport& t) {
    const int me = t.rank(), n = t.size();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    t.begin(collective("allreduce", 0, f32_sum(me == 0 ? 10 : 11)));
    std::vector<uint8_t> out(40, 1), in(40);
    std::string m;
    try {
      // The send waits too: its peer may be one that aborted already (rank 0 on rank
      // 1's abort, say), and then the send fails with that abort's reason.
      t.wait(t.isend(next, out.data(), out.size()));
      t.irecv(prev, in.data(), in.size());
      t.wait_all();
    } catch (const PeerError& e) {
      m = e.what();
      t.abort(m);
    }
    if (me > 1 && m.empty()) return;  // completed
    ASSERT_FALSE(m.empty()) << "rank " << me << "'s call completed";
    expect_mismatch(t, m);
    if (me == 1) {
      EXPECT_EQ(m.rfind("allreduce #0 failed on " + here_text(t) + ": mismatch with " +
                            peer_text(t, 0), 0), 0u) << m;
    }
  });
}

// Connections by use: the ranks below never exchanged anything with the one that
// leaves, so they have no stream from it. Each connects to it once its wait has lasted
// kSuspectAfter, and reads what happened in the refusal of the transport that closed or
// aborted (it stays open until the others are done, as a communicator does until it
// is destroyed). A rank whose process is gone refuses nothing: PeerProcessThatDies.
TEST_P(TcpTransportTest, PeerThatClosesIsNamedAsGone) {
  // The last rank closes at once; every other waits for eight bytes of broadcast #0
  // from it. Each fails naming it.
  std::latch others_done(GetParam() - 1);
  run_mesh(GetParam(), [&](Transport& t) {
    const int gone = t.size() - 1;
    if (t.rank() == gone) {
      t.close();
      others_done.wait();
      return;
    }
    CountDownOnExit done{others_done};
    t.begin(collective("broadcast", 0, Signature{8, gone, 0, transport::kNoReduce}));
    std::vector<uint8_t> buf(8);
    t.irecv(gone, buf.data(), buf.size());
    const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
    EXPECT_EQ(m.rfind("broadcast #0 failed on " + here_text(t) + ": rank ", 0), 0u) << m;
    EXPECT_TRUE(contains(m, peer_text(t, gone))) << m;
    EXPECT_TRUE(contains(m, ") left the communicator while this rank expected 8 bytes from it")) << m;
  });
}

TEST_P(TcpTransportTest, PeerThatAbortsPassesItsReasonOn) {
  // Rank 0 aborts at once; every other waits for eight bytes of reduce #0 from it and
  // fails with rank 0's reason.
  std::latch others_done(GetParam() - 1);
  run_mesh(GetParam(), [&](Transport& t) {
    if (t.rank() == 0) {
      t.abort("rank 0 gave up: the test says so");
      others_done.wait();
      return;
    }
    CountDownOnExit done{others_done};
    t.begin(collective("reduce", 0, f32_sum(2)));
    std::vector<uint8_t> buf(8);
    t.irecv(0, buf.data(), buf.size());
    const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
    EXPECT_EQ(m.rfind("reduce #0 failed on " + here_text(t) + ": rank ", 0), 0u) << m;
    const std::string end = ") aborted: rank 0 gave up: the test says so";
    EXPECT_TRUE(m.size() >= end.size() && m.compare(m.size() - end.size(), end.size(), end) == 0) << m;
    EXPECT_TRUE(contains(m, peer_text(t, 0))) << m;
  });
}

// A rank that already exchanged with the one that aborts reads the reason on its
// stream at once, even while it waits on a third rank.
TEST_P(TcpTransportTest, AbortReachesAPeerThatWaitsOnAnother) {
  // Rank 0 and rank 1 exchange first, so that each has a stream from the other; then
  // rank 1 waits for rank 2, which sends nothing until rank 1 is done, and rank 0
  // aborts. Its reason reaches rank 1 on the idle stream.
  if (GetParam() < 3) GTEST_SKIP() << "needs a third rank";
  std::latch rank1_done(1);
  run_mesh(GetParam(), [&](Transport& t) {
    if (t.rank() == 0 || t.rank() == 1) {
      const int other = 1 - t.rank();
      t.begin(collective("allreduce", 0, f32_sum(1)));
      std::vector<uint8_t> out(4, 1), in(4);
      t.isend(other, out.data(), out.size());
      t.irecv(other, in.data(), in.size());
      t.wait_all();
    }
    if (t.rank() == 0) {
      t.abort("rank 0 gave up while rank 1 waited on rank 2");
      rank1_done.wait();
      return;
    }
    if (t.rank() != 1) {
      rank1_done.wait();
      return;
    }
    t.begin(collective("gather", 1, Signature{2, 2, 0, transport::kNoReduce}));
    std::vector<uint8_t> buf(8);
    t.irecv(2, buf.data(), buf.size());
    CountDownOnExit release{rank1_done};
    const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
    EXPECT_EQ(m.rfind("gather #1 failed on " + here_text(t) + ": " + peer_text(t, 0), 0), 0u) << m;
    EXPECT_TRUE(contains(m, ") aborted: rank 0 gave up while rank 1 waited on rank 2")) << m;
  });
}

// And a rank that never exchanged with it learns it from the ranks between: each rank
// that fails aborts with its error (the communicator does), so the reason travels along
// the streams the algorithm uses. Rank 2 waits for rank 0, which aborts; rank 1 waits
// for rank 2.
TEST_P(TcpTransportTest, AbortTravelsAlongTheRanksThatWait) {
  if (GetParam() < 3) GTEST_SKIP() << "needs a third rank";
  std::latch all_done(3);  // ranks 0-2, each kept open until the others are done
  run_mesh(GetParam(), [&](Transport& t) {
    if (t.rank() == 0) {
      t.abort("rank 0 gave up first");
      all_done.arrive_and_wait();
      return;
    }
    if (t.rank() > 2) return;
    const int awaited = t.rank() == 2 ? 0 : 2;
    // A broadcast from rank 0 along a chain 0 -> 2 -> 1.
    t.begin(collective("broadcast", 0, Signature{2, 0, 0, transport::kNoReduce}));
    std::vector<uint8_t> buf(8);
    t.irecv(awaited, buf.data(), buf.size());
    const std::string m = failure_of<PeerError>(t, [&] { t.wait_all(); });
    EXPECT_EQ(m.rfind("broadcast #0 failed on " + here_text(t) + ": " + peer_text(t, awaited), 0), 0u)
        << m;
    EXPECT_TRUE(contains(m, "rank 0 gave up first")) << m;
    if (t.rank() == 2) t.abort(m);
    all_done.arrive_and_wait();
  });
}

TEST_P(TcpTransportTest, DeadlineThatPassesNamesTheAwaitedRank) {
  // Rank 0 waits 300 ms for eight bytes of scatter #0 from the last rank, which sends
  // nothing until rank 0 has timed out.
  std::latch rank0_done(1);
  run_mesh(GetParam(), [&](Transport& t) {
    const int awaited = t.size() - 1;
    if (t.rank() == awaited) rank0_done.wait();
    if (t.rank() != 0) return;
    t.begin(collective("scatter", 0, Signature{2, awaited, 0, transport::kNoReduce}, 300ms));
    std::vector<uint8_t> buf(8);
    t.irecv(awaited, buf.data(), buf.size());
    CountDownOnExit release{rank0_done};
    const auto start = Clock::now();
    std::vector<int> ranks;
    std::string m;
    try {
      t.wait_all();
      ADD_FAILURE() << "did not time out";
    } catch (const TimeoutError& e) {
      m = e.what();
      ranks = e.awaited_ranks();
    }
    const auto waited = Clock::now() - start;
    t.abort(m);
    EXPECT_GE(waited, 250ms);
    EXPECT_LT(waited, 5s);
    EXPECT_EQ(ranks, std::vector<int>{awaited});
    EXPECT_EQ(m.rfind("scatter #0 timed out on " + here_text(t) + "; still waiting: to receive " +
                          std::to_string(64 + buf.size()) + " bytes from " + peer_text(t, awaited), 0), 0u)
        << m;
  });
}

TEST_P(TcpTransportTest, InterruptFromAnotherThreadEndsTheWaitPromptly) {
  // Rank 0 waits (deadline 60 s) for rank 1, which sends nothing until rank 0 is done;
  // another thread interrupts rank 0 after 200 ms.
  std::latch rank0_done(1);
  run_mesh(GetParam(), [&](Transport& t) {
    if (t.rank() == 1) rank0_done.wait();
    if (t.rank() != 0) return;
    t.begin(collective("barrier", 0, Signature{}, 60s));
    uint8_t byte = 0;
    t.irecv(1, &byte, 1);
    CountDownOnExit release{rank0_done};
    const auto start = Clock::now();
    std::thread interrupter([&] {
      std::this_thread::sleep_for(200ms);
      t.interrupt("stopped by the test");
    });
    const std::string m = failure_of<AbortedError>(t, [&] { t.wait_all(); });
    const auto waited = Clock::now() - start;
    interrupter.join();
    EXPECT_GE(waited, 150ms);
    EXPECT_LT(waited, 2s);
    EXPECT_EQ(m, "barrier #0 on " + here_text(t) + " was aborted: stopped by the test");
  });
}

// Rank 1 is a forked process, killed (SIGKILL) once the mesh is up: its streams close
// with no goodbye and no abort frame, and rank 0, waiting for it, names it as dead.
TEST(TcpTransportProcess, PeerProcessThatDiesIsNamedAsDead) {
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  // Forked before this process starts any thread (the store server's among them).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    int code = 1;
    try {
      uint16_t port = 0;
      if (::read(to_child[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port)) {
        TcpStore store("127.0.0.1", port, 30s, std::string(kToken));
        std::unique_ptr<Transport> t = tcp::connect_mesh(store, 1, 2, mesh_options());
        const char ready = 1;
        if (::write(from_child[1], &ready, 1) == 1) {
          while (true) ::pause();  // until killed
        }
      }
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  TcpStoreServerOptions server_options;
  server_options.job_token = kToken;
  server_options.allowlist_file = "";
  TcpStoreServer server("127.0.0.1", 0, server_options);
  const uint16_t port = server.port();
  ASSERT_EQ(::write(to_child[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  TcpStore store("127.0.0.1", port, 30s, std::string(kToken));
  std::unique_ptr<Transport> t = tcp::connect_mesh(store, 0, 2, mesh_options());
  char ready = 0;
  ASSERT_EQ(::read(from_child[0], &ready, 1), 1) << "the child rank did not connect";
  ::close(to_child[1]);
  ::close(from_child[0]);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));

  t->begin(collective("allgather", 0, f32_sum(2)));
  std::vector<uint8_t> out(8, 1), in(8);
  t->isend(1, out.data(), out.size());
  t->irecv(1, in.data(), in.size());
  const std::string m = failure_of<PeerError>(*t, [&] { t->wait_all(); });
  EXPECT_EQ(m.rfind("allgather #0 failed on " + here_text(*t) + ": ", 0), 0u) << m;
  EXPECT_TRUE(contains(m, peer_text(*t, 1))) << m;
  EXPECT_TRUE(contains(m, "(the peer process died or aborted)")) << m;
}

}  // namespace
}  // namespace chorus
