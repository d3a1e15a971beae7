// The in-memory FakeTransport itself (its errors are the real transport's kinds), and
// what only it can show: how many messages and bytes each algorithm sends per rank,
// against the numbers the algorithms are designed for.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"
#include "rank_context.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus {
namespace {

namespace alg = algorithms;
using namespace std::chrono_literals;
using test::contains;
using test::FakeHub;
using test::FakeTransport;
using test::RankContext;
using test::run_ranks;

transport::OpInfo op_info(const char* name, uint64_t seq, std::chrono::milliseconds timeout) {
  transport::OpInfo info;
  info.name = name;
  info.code = transport::wire_code(parse_collective(name).value());
  info.seq = seq;
  info.deadline = Deadline(timeout);
  return info;
}

// Runs body on both ranks of a hub of two and returns what each threw ("" if nothing).
std::vector<std::string> two_ranks(const std::function<void(FakeTransport&)>& body) {
  FakeHub hub(2);
  auto errors = test::run_threads(2, [&](int rank) { body(hub.transport(rank)); }, 60s);
  return {test::describe(errors[0]), test::describe(errors[1])};
}

TEST(FakeTransport, MovesBytesInOrderAndCompletesSendsOnlyWhenReceived) {
  FakeHub hub(2);
  FakeTransport& a = hub.transport(0);
  FakeTransport& b = hub.transport(1);
  a.begin(op_info("allreduce", 1, 10s));
  b.begin(op_info("allreduce", 1, 10s));
  int first = 1, second = 2, got[2] = {0, 0};
  transport::Request s1 = a.isend(1, &first, sizeof first);
  transport::Request s2 = a.isend(1, &second, sizeof second);
  EXPECT_FALSE(a.test(s1)) << "a send completed before its receive was posted";
  b.wait(b.irecv(0, &got[0], sizeof got[0]));
  EXPECT_TRUE(a.test(s1));
  EXPECT_FALSE(a.test(s2));
  b.wait(b.irecv(0, &got[1], sizeof got[1]));
  a.wait_all();
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 2);
  EXPECT_EQ(hub.traffic(0).messages, 2u);
  EXPECT_EQ(hub.traffic(0).bytes, 2 * sizeof(int));
  EXPECT_EQ(hub.traffic(0).messages_to[1], 2u);
  EXPECT_EQ(hub.traffic(1).messages, 0u);
}

TEST(FakeTransport, LengthMismatchIsAPeerErrorOnTheReceiver) {
  auto errors = two_ranks([](FakeTransport& t) {
    t.begin(op_info("allreduce", 7, 10s));
    uint64_t value = 0;
    if (t.rank() == 0) t.wait(t.isend(1, &value, 8));
    else t.wait(t.irecv(0, &value, 4));
  });
  EXPECT_EQ(errors[0], "<no error>");
  EXPECT_TRUE(contains(errors[1], "peer failure")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "allreduce #7 failed on rank 1")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "mismatched message from rank 0")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "expected 4 bytes, got 8 bytes")) << errors[1];
}

TEST(FakeTransport, AnotherCallIsAPeerErrorNamingBoth) {
  auto errors = two_ranks([](FakeTransport& t) {
    t.begin(op_info(t.rank() == 0 ? "broadcast" : "allreduce", 3, 10s));
    uint32_t value = 0;
    if (t.rank() == 0) t.wait(t.isend(1, &value, 4));
    else t.wait(t.irecv(0, &value, 4));
  });
  EXPECT_TRUE(contains(errors[1], "allreduce #3 failed on rank 1")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "rank 0 called broadcast #3")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "this rank called allreduce #3")) << errors[1];
}

TEST(FakeTransport, DeadlineIsATimeoutErrorNamingTheAwaitedRank) {
  FakeHub hub(3);
  FakeTransport& t = hub.transport(2);
  t.begin(op_info("gather", 4, 200ms));
  uint8_t byte;
  t.irecv(0, &byte, 1);
  const auto start = std::chrono::steady_clock::now();
  try {
    t.wait_all();
    ADD_FAILURE() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.awaited_ranks(), std::vector<int>{0});
    EXPECT_TRUE(contains(e.what(), "gather #4 timed out on rank 2")) << e.what();
    EXPECT_TRUE(contains(e.what(), "to receive 1 bytes from rank 0")) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
}

TEST(FakeTransport, AbortReachesThePeersAndInterruptTheRank) {
  auto errors = two_ranks([](FakeTransport& t) {
    t.begin(op_info("barrier", 2, 30s));
    uint8_t byte;
    if (t.rank() == 0) {
      t.abort("stop here");
      return;
    }
    t.wait(t.irecv(0, &byte, 1));
  });
  EXPECT_TRUE(contains(errors[1], "barrier #2 failed on rank 1")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "rank 0 aborted: stop here")) << errors[1];

  FakeHub hub(2);
  FakeTransport& t = hub.transport(0);
  t.begin(op_info("barrier", 1, 30s));
  uint8_t byte;
  t.irecv(1, &byte, 1);
  t.interrupt("shutting down");
  std::string message = test::error_of<AbortedError>([&] { t.wait_all(); });
  EXPECT_TRUE(contains(message, "barrier #1 on rank 0")) << message;
  EXPECT_TRUE(contains(message, "shutting down")) << message;
}

// ---- message counts

class MessageCounts : public testing::TestWithParam<int> {};

// Runs `fn(ctx)` once on every rank (its own buffers inside) with `count` f32 elements
// (sum) and returns each rank's traffic.
std::vector<test::Traffic> traffic_of(int size, size_t count, size_t segment,
                                      const std::function<void(const alg::Context&)>& fn) {
  FakeHub hub(size);
  run_ranks(hub, [&](FakeTransport& t) {
    RankContext rc(t);
    fn(rc.begin("allreduce", DataType::kFloat32, true, ReduceOp::kSum, count, -1, segment));
  });
  std::vector<test::Traffic> out;
  for (int r = 0; r < size; ++r) out.push_back(hub.traffic(r));
  return out;
}

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Ring allreduce: 2 (p - 1) steps, each one chunk in as many messages as the chunk
// has segments; every rank sends every chunk but its own in the reduce-scatter and
// every chunk but its right neighbour's in the allgather.
TEST_P(MessageCounts, AllreduceRingSendsTwoPMinusOneChunksPerRank) {
  const int p = GetParam();
  for (size_t count : {size_t{1000}, size_t{4099}}) {
    for (size_t segment : {kDefaultSegmentBytes, size_t{64}}) {
      auto traffic = traffic_of(p, count, segment, [&](const alg::Context& ctx) {
        std::vector<float> in(count, 1.0f), out(count);
        alg::allreduce_ring(ctx, in.data(), out.data(), count);
      });
      const size_t max_chunk = alg::block_count(count, p, 0) * sizeof(float);
      const uint64_t per_chunk = (max_chunk + segment - 1) / segment;
      for (int r = 0; r < p; ++r) {
        const uint64_t expected = p == 1 ? 0 : 2 * static_cast<uint64_t>(p - 1) * per_chunk;
        EXPECT_EQ(traffic[r].messages, expected) << "rank " << r << ", segment " << segment;
        const uint64_t own = alg::block_count(count, p, r) * sizeof(float);
        const uint64_t right = alg::block_count(count, p, (r + 1) % p) * sizeof(float);
        const uint64_t total = count * sizeof(float);
        EXPECT_EQ(traffic[r].bytes, p == 1 ? 0 : 2 * total - own - right) << "rank " << r;
        if (p > 1) {
          EXPECT_EQ(traffic[r].messages_to[(r + 1) % p], expected) << "only to the right";
        }
      }
    }
  }
}

// Recursive doubling: log2 p exchanges of the whole buffer on a power of two; on other
// sizes the folded ranks hand their data over (one message) and get the result back.
TEST_P(MessageCounts, AllreduceRecursiveDoublingSendsLog2PMessages) {
  const int p = GetParam();
  const size_t count = 1000;
  auto traffic = traffic_of(p, count, kDefaultSegmentBytes, [&](const alg::Context& ctx) {
    std::vector<float> in(count, 1.0f), out(count);
    alg::allreduce_recursive_doubling(ctx, in.data(), out.data(), count);
  });
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int rounds = ceil_log2(pow2), rem = p - pow2;
  for (int r = 0; r < p; ++r) {
    uint64_t expected = static_cast<uint64_t>(rounds);
    if (r < 2 * rem) expected = r % 2 == 0 ? 1 : rounds + 1;  // even: sits out
    EXPECT_EQ(traffic[r].messages, expected) << "rank " << r;
    EXPECT_EQ(traffic[r].bytes, expected * count * sizeof(float)) << "rank " << r;
  }
}

// Binomial broadcast: p - 1 messages in all, one to every rank but the root, the root
// sending ceil(log2 p). Dissemination barrier: ceil(log2 p) empty messages per rank.
// Direct gather: one message per rank but the root.
TEST_P(MessageCounts, BroadcastBarrierAndGather) {
  const int p = GetParam();
  for (int root : {0, p - 1}) {
    auto traffic = traffic_of(p, 100, kDefaultSegmentBytes, [&](const alg::Context& ctx) {
      std::vector<float> buf(100, 1.0f);
      alg::broadcast_binomial(ctx, buf.data(), buf.size(), root);
    });
    std::vector<uint64_t> received(p, 0);
    uint64_t total = 0;
    for (int r = 0; r < p; ++r) {
      total += traffic[r].messages;
      for (int q = 0; q < p; ++q) received[q] += traffic[r].messages_to[q];
    }
    EXPECT_EQ(total, static_cast<uint64_t>(p - 1)) << "root " << root;
    EXPECT_EQ(traffic[root].messages, static_cast<uint64_t>(ceil_log2(p))) << "root " << root;
    for (int q = 0; q < p; ++q) EXPECT_EQ(received[q], q == root ? 0u : 1u) << "rank " << q;
  }
  auto barrier = traffic_of(p, 0, kDefaultSegmentBytes,
                            [](const alg::Context& ctx) { alg::barrier_dissemination(ctx); });
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(barrier[r].messages, static_cast<uint64_t>(ceil_log2(p))) << "rank " << r;
    EXPECT_EQ(barrier[r].bytes, 0u);
  }
  auto gather = traffic_of(p, 10, kDefaultSegmentBytes, [&](const alg::Context& ctx) {
    std::vector<float> in(10, 1.0f), out(10 * p);
    alg::gather_direct(ctx, in.data(), out.data(), 10, 0);
  });
  for (int r = 0; r < p; ++r) EXPECT_EQ(gather[r].messages, r == 0 ? 0u : 1u) << "rank " << r;
}

std::string size_name(const testing::TestParamInfo<int>& info) {
  return "size" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(FakeTransport, MessageCounts, testing::Range(1, 9), size_name);

}  // namespace
}  // namespace chorus
