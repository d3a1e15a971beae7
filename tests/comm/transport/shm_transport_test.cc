// ShmTransport on its own: the Transport of a node's ranks over the streams of their
// segment, with ranks as threads meeting in an in-memory store. Messages keep their
// order per stream and arrive whole, also when they are longer than the ring and both
// ranks send before they receive; a message of another call, or ranks that wait for
// each other under different calls, fail naming both calls; a silent peer runs into
// the deadline naming it; wait_for() returns when its slice is over. The routed
// transport (local peers through these streams, the others over tcp) runs every sweep
// as the "routed:" copies of the communicator suites (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
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

// Every rank sends to every other, then receives, many messages per stream, some
// empty, some longer than the ring (256 KiB here): all posted before any wait, so the
// long ones only move because waits drive every stream, in both directions at once.
TEST(ShmTransportTest, EveryStreamKeepsItsOrderAndLongMessagesPassEachOther) {
  for (int size : {2, 3, 5}) {
    SCOPED_TRACE("size " + std::to_string(size));
    auto length = [](int from, int to, int k) -> size_t {
      if (k % 5 == 4) return 0;
      return k == 2 ? (size_t{600} << 10) + from * 3 + to : static_cast<size_t>(1 + (from * 7 + to * 13 + k * 101) % 5000);
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
