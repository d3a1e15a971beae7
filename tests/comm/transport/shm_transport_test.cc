// ShmTransport on its own: the Transport of a node's ranks over the streams of their
// segment, with ranks as threads meeting in an in-memory store. The segment's layout
// grows with the local ranks, not with their pairs. Messages keep their order per
// stream and arrive whole, between every pair of ranks, also when they are longer than
// the ring and both ranks send before they receive, and when a rank sends to more peers
// than it has stream slots (they are bound and bound again as receivers read); a
// message of another call, or ranks that wait for each other under different calls,
// fail naming both calls; a silent peer runs into the deadline naming it, as do
// receivers that hold every stream slot of a sender without reading, and one of them
// that closes is an error naming it; wait_for() returns when its slice is over. The routed
// transport (local peers through these streams, the others over tcp) runs every sweep
// as the "routed:" copies of the communicator suites (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "comm/transport/shm/layout.h"
#include "comm/transport/shm/shm_group.h"
#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/shm_groups.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using test::contains;
using transport::OpInfo;
using transport::Request;
using transport::shm::Layout;
using transport::shm::ShmGroup;
using transport::shm::ShmTransport;

struct Rank {
  std::unique_ptr<ShmGroup> group;
  std::unique_ptr<ShmTransport> transport;
};

Rank connect(Store& store, int rank, int size) {
  Rank out;
  out.group = connect_group(store, rank, size);
  out.transport = std::make_unique<ShmTransport>(*out.group, size);
  return out;
}

OpInfo call(Collective c, uint64_t seq, uint64_t count, int root = -1,
            std::chrono::milliseconds deadline = 20s) {
  OpInfo op;
  op.name = collective_name(c);
  op.code = transport::wire_code(c);
  op.seq = seq;
  op.kind = is_p2p(c) ? transport::FrameKind::kP2P : transport::FrameKind::kCollective;
  op.deadline = Deadline(deadline);
  op.sig.count = count;
  op.sig.root = root;
  op.sig.dtype = static_cast<uint8_t>(DataType::kUInt8);
  return op;
}

// Runs fn(rank, transport) on `size` threads, each with its rank of one group.
template <class Fn>
void run_group(int size, Fn fn) {
  InMemoryStore store;
  std::vector<Rank> ranks(size);
  test::rethrow_rank_failures(test::run_threads(size, [&](int r) { ranks[r] = connect(store, r, size); }));
  auto errors = test::run_threads(size, [&](int r) { fn(r, *ranks[r].transport); });
  for (Rank& r : ranks) r.transport->close();
  test::rethrow_rank_failures(errors);
}

uint8_t byte_of(int from, int to, int k, size_t i) {
  return static_cast<uint8_t>(i * 131 + from * 17 + to * 29 + k * 7 + (i >> 11));
}

// The segment of n local ranks, with the default buffers (1 MiB each): its bytes per
// rank stay bounded from 2 to 256 ranks (a ring per ordered pair made 256 ranks' 4.96
// GB), 256 ranks' under 256 MiB; up to 9 ranks a ring per pair as before (2 to 8 ranks:
// the layout their speed was measured with), beyond a pool of slots per rank; the
// parts add up to the whole.
TEST(ShmLayoutTest, TheSegmentGrowsWithTheRanksNotWithTheirPairs) {
  const size_t mib = size_t{1} << 20;
  for (int n : {2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 33, 64, 128, 255, 256}) {
    SCOPED_TRACE("local ranks " + std::to_string(n));
    const Layout l = Layout::of(n, mib);
    // Per rank: its control block, two buffers and its slots (and a share of the header).
    const size_t per_rank = l.bytes / static_cast<size_t>(n);
    EXPECT_LE(per_rank, 4 * mib);
    EXPECT_LE(per_rank, 8192 + 2 * l.buffer_bytes + static_cast<size_t>(l.slots) * (l.slot_control + l.ring_bytes));
    EXPECT_EQ(l.bytes, l.slots_offset + static_cast<size_t>(n) * l.slots * (l.slot_control + l.ring_bytes));
    EXPECT_EQ(l.slots_offset, l.data_offset + static_cast<size_t>(n) * 2 * l.buffer_bytes);
    EXPECT_GE(l.data_offset, transport::shm::kHeaderBytes + static_cast<size_t>(n) * transport::shm::kControlBytes);
    EXPECT_EQ(l.pooled, n - 1 > transport::shm::kStreamSlots);
    EXPECT_EQ(l.slots, l.pooled ? transport::shm::kStreamSlots : n - 1);
    EXPECT_LE(l.buffer_bytes, mib);
    EXPECT_LE(static_cast<size_t>(n) * 2 * l.buffer_bytes, std::max(transport::shm::kBuffersBudget, 4 * mib));
    EXPECT_GE(l.ring_bytes, size_t{32} << 10);
    if (n <= 8) {
      EXPECT_EQ(l.buffer_bytes, mib);
      EXPECT_EQ(l.ring_bytes, n <= 6 ? size_t{256} << 10 : size_t{128} << 10);
    }
  }
  EXPECT_LT(Layout::of(256, mib).bytes, 256 * mib);
  // Buffers asked smaller than the budget's share stay as asked.
  EXPECT_EQ(Layout::of(256, 64 << 10).buffer_bytes, size_t{64} << 10);
  EXPECT_EQ(Layout::of(3, 4096).buffer_bytes, size_t{4096});
}

// Every rank sends to every other, then receives, many messages per stream, some
// empty, some over twice as long as the ring (256 KiB up to 6 ranks, 32 KiB from 10):
// all posted
// before any wait, so the long ones only move because waits drive every stream, in
// both directions at once. From 10 ranks a rank has fewer stream slots (8) than
// peers: its sends to the others wait for slots that their receivers empty, every
// pair's messages through several slots in turn.
TEST(ShmTransportTest, EveryStreamKeepsItsOrderAndLongMessagesPassEachOther) {
  for (int size : {2, 3, 5, 7, 9, 11, 19}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const size_t ring = Layout::of(size, 64 << 10).ring_bytes;  // connect_group()'s buffers
    auto length = [&](int from, int to, int k) -> size_t {
      if (k % 5 == 4) return 0;
      return k == 2 ? 2 * ring + (size_t{88} << 10) + from * 3 + to
                    : static_cast<size_t>(1 + (from * 7 + to * 13 + k * 101) % 5000);
    };
    constexpr int kMessages = 6;
    run_group(size, [&](int me, ShmTransport& t) {
      t.begin(call(Collective::kAllreduce, 1, 0));
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<Request> requests;
      for (int q = 0; q < size; ++q) {
        for (int k = 0; k < kMessages && q != me; ++k) {
          out.emplace_back(length(me, q, k));
          for (size_t i = 0; i < out.back().size(); ++i) out.back()[i] = byte_of(me, q, k, i);
          requests.push_back(t.isend(q, out.back().data(), out.back().size()));
        }
      }
      std::vector<std::pair<int, int>> from;
      for (int q = 0; q < size; ++q) {
        for (int k = 0; k < kMessages && q != me; ++k) {
          in.emplace_back(length(q, me, k), 0xEE);
          from.emplace_back(q, k);
          requests.push_back(t.irecv(q, in.back().data(), in.back().size()));
        }
      }
      t.wait_all();
      for (const Request& r : requests) EXPECT_TRUE(t.test(r));
      for (size_t m = 0; m < in.size(); ++m) {
        const auto [q, k] = from[m];
        for (size_t i = 0; i < in[m].size(); ++i) {
          ASSERT_EQ(in[m][i], byte_of(q, me, k, i)) << "message " << k << " from " << q << ", byte " << i;
        }
      }
    });
  }
}

// Pairwise exchanges, as an alltoall makes them: in step k every rank sends to the
// rank k after it and receives from the rank k before it, with more peers than stream
// slots, so that every step binds slots anew and receivers find their sender's bytes
// in a slot other than the last one; twice over, and checked.
TEST(ShmTransportTest, PairwiseExchangesFindTheirSlotsEveryStep) {
  constexpr int kSize = 13;
  ASSERT_TRUE(Layout::of(kSize, 64 << 10).pooled);
  run_group(kSize, [&](int me, ShmTransport& t) {
    t.begin(call(Collective::kAlltoall, 1, 0));
    for (int round = 0; round < 2; ++round) {
      for (int k = 1; k < kSize; ++k) {
        const int to = (me + k) % kSize, from = (me - k + kSize) % kSize;
        const size_t out_len = 100 + to * 997 + round * 40000, in_len = 100 + me * 997 + round * 40000;
        std::vector<uint8_t> out(out_len), in(in_len, 0xEE);
        for (size_t i = 0; i < out.size(); ++i) out[i] = byte_of(me, to, round, i);
        const Request rr = t.irecv(from, in.data(), in.size());
        const Request rs = t.isend(to, out.data(), out.size());
        t.wait(rs);
        t.wait(rr);
        for (size_t i = 0; i < in.size(); ++i) {
          ASSERT_EQ(in[i], byte_of(from, me, round, i)) << "round " << round << ", from " << from << ", byte " << i;
        }
      }
    }
  });
}

// Rank 0 sends to 8 ranks that do not read yet, one message each, filling its 8 stream
// slots; its send to a ninth rank then has no slot and waits for them: the deadline
// names the send and the ranks holding the slots (its awaited ranks). Once they read,
// their messages are intact.
TEST(ShmTransportTest, ASendWithEverySlotHeldUnreadNamesTheHolders) {
  constexpr int kSize = 10;
  ASSERT_EQ(Layout::of(kSize, 64 << 10).slots, 8);
  std::string error;
  std::vector<int> awaited;
  std::atomic<bool> timed_out{false};
  run_group(kSize, [&](int me, ShmTransport& t) {
    t.begin(call(Collective::kGather, 4, 0, 0, me == 0 ? 700ms : 20s));
    if (me == 0) {
      for (int q = 1; q < kSize; ++q) {
        std::vector<uint8_t> out(300 + q);
        for (size_t i = 0; i < out.size(); ++i) out[i] = byte_of(0, q, 0, i);
        try {
          t.wait(t.isend(q, out.data(), out.size()));
          EXPECT_LT(q, kSize - 1) << "the send to the last rank completed";
        } catch (const TimeoutError& e) {
          EXPECT_EQ(q, kSize - 1);
          error = e.what();
          awaited = e.awaited_ranks();
        }
      }
      timed_out = true;
      return;
    }
    while (!timed_out.load()) std::this_thread::sleep_for(2ms);
    if (me == kSize - 1) return;
    std::vector<uint8_t> in(300 + me, 0xEE);
    t.wait(t.irecv(0, in.data(), in.size()));
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], byte_of(0, me, 0, i)) << "byte " << i;
  });
  EXPECT_TRUE(contains(error, "gather #4 timed out on rank 0 (host h0) waiting in shared memory for a stream "
                              "slot to send")) << error;
  EXPECT_TRUE(contains(error, "bytes to rank 9 (host h9) (all 8 of this rank's hold bytes not read by rank 1 "
                              "(host h1) rank 2 (host h2)")) << error;
  EXPECT_EQ(awaited, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// The same, but the receivers holding rank 0's slots close the communicator without
// reading: its send to the ninth rank is an error naming one of them, not a wait.
TEST(ShmTransportTest, AHolderThatClosesWithoutReadingIsAnError) {
  constexpr int kSize = 10;
  std::string error;
  std::atomic<int> closed{0};
  std::atomic<bool> sent{false}, done{false};
  run_group(kSize, [&](int me, ShmTransport& t) {
    t.begin(call(Collective::kScatter, 6, 0, 0));
    if (me == 0) {
      std::vector<uint8_t> out(64, 7);
      for (int q = 1; q < kSize - 1; ++q) t.wait(t.isend(q, out.data(), out.size()));
      sent = true;
      while (closed.load() < kSize - 2) std::this_thread::sleep_for(2ms);
      try {
        t.wait(t.isend(kSize - 1, out.data(), out.size()));
        ADD_FAILURE() << "the send completed";
      } catch (const PeerError& e) {
        error = e.what();
      }
      done = true;
      return;
    }
    if (me == kSize - 1) {
      while (!done.load()) std::this_thread::sleep_for(2ms);
      return;
    }
    while (!sent.load()) std::this_thread::sleep_for(2ms);
    t.close();
    ++closed;
  });
  EXPECT_TRUE(contains(error, "scatter #6 failed on rank 0 (host h0): rank ")) << error;
  EXPECT_TRUE(contains(error, " closed the communicator without reading what this rank sent it, holding a stream "
                              "slot this rank needs to send to rank 9 (host h9)")) << error;
}

// A message of another collective call (here: another root) is an error on the rank
// that receives it, naming both calls.
TEST(ShmTransportTest, AMessageOfAnotherCallNamesBothCalls) {
  std::string error;
  run_group(2, [&](int me, ShmTransport& t) {
    std::vector<uint8_t> buf(64, 1);
    if (me == 0) {
      t.begin(call(Collective::kBroadcast, 3, 64, 0));
      t.wait(t.isend(1, buf.data(), buf.size()));
      return;
    }
    t.begin(call(Collective::kBroadcast, 3, 64, 1));
    try {
      t.wait(t.irecv(0, buf.data(), buf.size()));
      ADD_FAILURE() << "the receive of another call's message succeeded";
    } catch (const PeerError& e) {
      error = e.what();
    }
  });
  EXPECT_TRUE(contains(error, "broadcast #3 failed on rank 1 (host h1): mismatch with rank 0 (host h0)")) << error;
  EXPECT_TRUE(contains(error, "rank 0 called broadcast #3 with u8 × 64, root 0")) << error;
  EXPECT_TRUE(contains(error, "this rank called broadcast #3 with u8 × 64, root 1")) << error;
}

// Two ranks that each wait for the other under different calls have nothing to read:
// the calls they publish after kSuspectAfter name the disagreement, long before the
// deadline.
TEST(ShmTransportTest, RanksWaitingForEachOtherUnderDifferentCallsFailNamingBoth) {
  std::string errors[2];
  run_group(2, [&](int me, ShmTransport& t) {
    std::vector<uint8_t> buf(16);
    t.begin(call(Collective::kBroadcast, 5, 16, me == 0 ? 1 : 0));
    try {
      t.wait(t.irecv(1 - me, buf.data(), buf.size()));
      ADD_FAILURE() << "rank " << me << " received";
    } catch (const PeerError& e) {
      errors[me] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(contains(errors[r], "broadcast #5 failed on rank " + std::to_string(r))) << errors[r];
    EXPECT_TRUE(contains(errors[r], "called broadcast #5 with u8 × 16, root 0")) << errors[r];
    EXPECT_TRUE(contains(errors[r], "called broadcast #5 with u8 × 16, root 1")) << errors[r];
  }
}

// A peer that never sends: the deadline names it and what was awaited; wait_for()
// returns false when its slice is over and the request is still pending.
TEST(ShmTransportTest, ASilentPeerRunsIntoTheDeadlineAndSlicesEnd) {
  std::string error;
  std::atomic<bool> done{false};
  run_group(2, [&](int me, ShmTransport& t) {
    if (me == 0) {
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<uint8_t> buf(8);
    t.begin(call(Collective::kAllreduce, 9, 8, -1, 700ms));
    const Request r = t.irecv(0, buf.data(), buf.size());
    EXPECT_FALSE(t.wait_for(&r, 20ms));
    EXPECT_FALSE(t.wait_for(nullptr, 0us));
    try {
      t.wait(r);
      ADD_FAILURE() << "the receive completed";
    } catch (const TimeoutError& e) {
      error = e.what();
      EXPECT_EQ(e.awaited_ranks(), std::vector<int>{0});
    }
    done = true;
  });
  EXPECT_TRUE(contains(error, "allreduce #9 timed out on rank 1 (host h1) waiting in shared memory for "
                              "rank 0 (host h0) to send")) << error;
}

}  // namespace
}  // namespace chorus
