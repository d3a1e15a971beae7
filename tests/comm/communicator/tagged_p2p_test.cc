// Send/recv matched by sender and tag, and receives from any source (recv_any), over
// tcp and over shared memory: messages received out of the order they were sent when
// their tags say so, the order of each (sender, tag) kept, any-source receives that
// find every sender once, two communicators sharing a RecvClaim taking one message
// between them, and the errors: a held message of another count, a receive that waits
// past the deadline naming the tag and the ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "chorus/communicator.h"
#include "chorus/error.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using std::chrono::seconds;

constexpr DataType kF32 = DataType::kFloat32;

class TaggedP2PTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  CommOptions options() const {
    CommOptions o = test::test_options();
    o.transport = GetParam();
    o.timeout = seconds(30);
    return o;
  }
};

// Every rank sends each other rank three messages with tags 3, 1, 2 (and a second one
// with tag 1); the receiver asks for tags 2, 1, 1, 3: all but the first arrive ahead of
// their receive and are held. Counts differ per message, so that a wrong match shows.
TEST_P(TaggedP2PTest, ReceivesByTagOutOfSendOrder) {
  for (int size : {2, 3, 5}) {
    test::run_ranks(size, [](Communicator& c) {
      const int rank = c.rank(), world = c.size();
      const int send_tags[] = {3, 1, 2, 1};
      auto count_of = [](int from, int which) { return static_cast<size_t>(5 + from + 7 * which); };
      auto value = [](int from, int which, size_t j) {
        return static_cast<float>(from * 1000 + which * 100 + static_cast<int>(j));
      };
      std::vector<std::vector<float>> out;
      std::vector<Work> sends;
      for (int peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        for (int which = 0; which < 4; ++which) {
          std::vector<float> m(count_of(rank, which));
          for (size_t j = 0; j < m.size(); ++j) m[j] = value(rank, which, j);
          out.push_back(std::move(m));
        }
      }
      size_t k = 0;
      for (int peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        for (int which = 0; which < 4; ++which, ++k) {
          sends.push_back(c.send(out[k].data(), out[k].size(), kF32, peer, send_tags[which]));
        }
      }
      // Receive order by tag: 2 (message 2), 1 (message 1), 1 (message 3), 3 (message 0).
      const int recv_which[] = {2, 1, 3, 0};
      for (int peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        for (int which : recv_which) {
          std::vector<float> in(count_of(peer, which), -1.f);
          Work w = c.recv(in.data(), in.size(), kF32, peer, send_tags[which]);
          w.wait();
          EXPECT_EQ(w.source(), peer);
          for (size_t j = 0; j < in.size(); ++j) {
            ASSERT_EQ(in[j], value(peer, which, j))
                << "rank " << rank << " from " << peer << " message " << which << " element " << j;
          }
        }
      }
      for (Work& w : sends) w.wait();
    }, options());
  }
}

// Rank 0 receives from any source, two messages from each other rank (tag 7), in
// whatever order they come; one stray message with tag 9 from each rank is held and
// received afterwards by tag. Every sender shows up exactly twice.
TEST_P(TaggedP2PTest, AnySourceFindsEverySender) {
  for (int size : {2, 4, 7}) {
    test::run_ranks(size, [](Communicator& c) {
      const int rank = c.rank(), world = c.size();
      if (rank != 0) {
        std::vector<float> stray(3, static_cast<float>(-rank));
        std::vector<float> a(4, static_cast<float>(rank)), b(4, static_cast<float>(rank + 100));
        Work s0 = c.send(stray.data(), stray.size(), kF32, 0, 9);
        Work s1 = c.send(a.data(), a.size(), kF32, 0, 7);
        Work s2 = c.send(b.data(), b.size(), kF32, 0, 7);
        s0.wait();
        s1.wait();
        s2.wait();
        return;
      }
      std::vector<int> seen(world, 0);
      for (int n = 0; n < 2 * (world - 1); ++n) {
        std::vector<float> in(4, -1.f);
        Work w = c.recv_any(in.data(), in.size(), kF32, 7);
        w.wait();
        const int from = w.source();
        ASSERT_GE(from, 1);
        ASSERT_LT(from, world);
        // Each sender's first message (its rank) comes before its second (rank + 100).
        const float want = static_cast<float>(seen[from] == 0 ? from : from + 100);
        for (float x : in) EXPECT_EQ(x, want) << "from rank " << from;
        ++seen[from];
      }
      for (int r = 1; r < world; ++r) EXPECT_EQ(seen[r], 2) << "rank " << r;
      for (int r = 1; r < world; ++r) {
        std::vector<float> in(3, 0.f);
        Work w = c.recv(in.data(), in.size(), kF32, r, 9);
        w.wait();
        EXPECT_EQ(w.source(), r);
        for (float x : in) EXPECT_EQ(x, static_cast<float>(-r));
      }
    }, options());
  }
}

// Two communicators, as c10d's lower and higher send/recv communicators: rank 1's
// any-source receive is issued on both with one claim. Each message is taken once; the
// receive that lost completes with source -1 and the message it saw stays for the next.
TEST_P(TaggedP2PTest, ClaimSharedByTwoCommunicatorsTakesOneMessage) {
  test::run_ranks(3, [](Communicator& c) {
    std::shared_ptr<Communicator> other = c.split(0, c.rank());
    const int rank = c.rank();
    if (rank != 1) {
      float x = static_cast<float>(rank + 1);
      // Rank 0 sends on `c`, rank 2 on `other`.
      (rank == 0 ? c : *other).send(&x, 1, kF32, 1, 4).wait();
      // Both communicators stay until rank 1 has both messages: a sender that left
      // would fail the receive still waiting on it (its source's goodbye), whichever
      // of the two receives the claim would have let win.
      c.barrier().wait();
      return;
    }
    std::vector<int> got;
    for (int n = 0; n < 2; ++n) {
      auto claim = std::make_shared<RecvClaim>();
      float a = 0, b = 0;
      Work wa = c.recv_any(&a, 1, kF32, 4, {0}, claim);
      Work wb = other->recv_any(&b, 1, kF32, 4, {2}, claim);
      wa.wait();
      wb.wait();
      ASSERT_TRUE((wa.source() >= 0) != (wb.source() >= 0))
          << "sources " << wa.source() << " and " << wb.source();
      const int from = std::max(wa.source(), wb.source());
      EXPECT_EQ(from == 0 ? a : b, static_cast<float>(from + 1));
      got.push_back(from);
    }
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, (std::vector<int>{0, 2}));
    c.barrier().wait();
  }, options());
}

// The receive that loses the claim can no longer get a message from its source, who has
// gone on to the next collective (rank 0's barrier frame arrives while the receive
// still looks): it completes with source -1, leaving the frame to the barrier.
TEST_P(TaggedP2PTest, ClaimLoserLeavesTheNextCollectiveItsFrame) {
  test::run_ranks(3, [](Communicator& c) {
    std::shared_ptr<Communicator> other = c.split(0, c.rank());
    if (c.rank() == 2) {
      float x = 3;
      other->send(&x, 1, kF32, 1, 4).wait();
    } else if (c.rank() == 1) {
      auto claim = std::make_shared<RecvClaim>();
      float a = 0, b = 0;
      Work wa = c.recv_any(&a, 1, kF32, 4, {0}, claim);
      Work wb = other->recv_any(&b, 1, kF32, 4, {2}, claim);
      wb.wait();
      wa.wait();
      EXPECT_EQ(wb.source(), 2);
      EXPECT_EQ(b, 3.f);
      EXPECT_EQ(wa.source(), -1);
    }
    c.barrier().wait();  // rank 0 goes here at once
  }, options());
}

// The receive whose only source left (rank 2 sends nothing and destroys the
// communicator) waits for the claim rather than failing: the receive on the other
// communicator takes rank 0's later message, and the first completes with -1.
TEST_P(TaggedP2PTest, ClaimWhoseSourceLeftWaitsForTheOtherReceive) {
  test::run_ranks(3, [](Communicator& c) {
    std::shared_ptr<Communicator> other = c.split(0, c.rank());
    if (c.rank() == 2) {
      other.reset();  // its goodbye reaches rank 1 first
    } else if (c.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      float x = 1;
      c.send(&x, 1, kF32, 1, 4).wait();
    } else {
      auto claim = std::make_shared<RecvClaim>();
      float a = 0, b = 0;
      Work wb = other->recv_any(&b, 1, kF32, 4, {2}, claim);
      Work wa = c.recv_any(&a, 1, kF32, 4, {0}, claim);
      wa.wait();
      wb.wait();
      EXPECT_EQ(wa.source(), 0);
      EXPECT_EQ(a, 1.f);
      EXPECT_EQ(wb.source(), -1);
    }
    c.barrier().wait();
  }, options());
}

// A claim nobody takes, whose sources left: no hang, the deadline's TimeoutError.
TEST_P(TaggedP2PTest, ClaimNobodyTakesTimesOutAfterItsSourceLeft) {
  CommOptions o = options();
  o.timeout = std::chrono::milliseconds(1500);
  test::run_ranks(2, [](Communicator& c) {
    std::shared_ptr<Communicator> other = c.split(0, c.rank());
    if (c.rank() == 0) {
      other.reset();
      return;
    }
    float b = 0;
    EXPECT_THROW(other->recv_any(&b, 1, kF32, 4, {0}, std::make_shared<RecvClaim>()).wait(),
                 TimeoutError);
  }, o);
}

// A held message (tag 1) that its receive asks for with another count: PeerError naming
// the sender and both calls.
TEST_P(TaggedP2PTest, HeldMessageOfAnotherCountIsAMismatch) {
  test::run_ranks(2, [](Communicator& c) {
    std::vector<float> buf(8, 1.f);
    if (c.rank() == 0) {
      c.send(buf.data(), 2, kF32, 1, 1).wait();
      c.send(buf.data(), 3, kF32, 1, 2).wait();
      return;
    }
    c.recv(buf.data(), 3, kF32, 0, 2).wait();
    try {
      c.recv(buf.data(), 5, kF32, 0, 1).wait();
      ADD_FAILURE() << "a 5-element recv took a 2-element message";
    } catch (const PeerError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("rank 0 called send with f32 × 2, tag 1"), std::string::npos) << m;
      EXPECT_NE(m.find("this rank called recv with f32 × 5, tag 1"), std::string::npos) << m;
    }
  }, options());
}

// A receive whose message never comes (the sender used another tag) times out naming
// the tag and the rank it waited for.
TEST_P(TaggedP2PTest, ReceiveForATagNobodySendsTimesOut) {
  CommOptions o = options();
  o.timeout = std::chrono::milliseconds(1500);
  test::run_ranks(3, [](Communicator& c) {
    float x = 1;
    if (c.rank() == 0) {
      try {
        c.recv_any(&x, 1, kF32, 5).wait();
        ADD_FAILURE() << "a receive of tag 5 completed";
      } catch (const TimeoutError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("for any of: rank 1"), std::string::npos) << m;
        EXPECT_NE(m.find("to send a message with tag 5"), std::string::npos) << m;
        EXPECT_EQ(e.awaited_ranks(), (std::vector<int>{1, 2}));
      }
    } else {
      c.send(&x, 1, kF32, 0, 6).wait();
    }
  }, o);
}

TEST_P(TaggedP2PTest, BadSourcesAreRefused) {
  test::run_ranks(2, [](Communicator& c) {
    float x = 0;
    EXPECT_THROW(c.recv_any(&x, 1, kF32, 0, {c.rank()}), InvalidArgumentError);
    EXPECT_THROW(c.recv_any(&x, 1, kF32, 0, {5}), InvalidArgumentError);
    EXPECT_THROW(c.recv_any(&x, 1, kF32, 0, {1 - c.rank(), 1 - c.rank()}), InvalidArgumentError);
  }, options());
}

INSTANTIATE_TEST_SUITE_P(Transports, TaggedP2PTest,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kShm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return info.param == TransportKind::kTcp ? "tcp" : "shm";
                         });

}  // namespace
}  // namespace chorus
