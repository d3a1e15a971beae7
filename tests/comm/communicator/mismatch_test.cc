// Calls that disagree between ranks (issue 21, item 2): same byte count but another
// dtype, another reduction, another broadcast root, a recv of another dtype than its
// send, allgathers of different counts. Every rank must fail: the call itself, or, where
// its part legitimately completed before the disagreement could reach it (documented in
// include/chorus/communicator.h), its next call; each message names the operation and
// its sequence number first, then both ranks and what each called. Correct calls before
// the mismatched one still give bit-exact results. Ranks are threads: over shared
// memory, and over tcp in the "tcp:" copies (CHORUS_TRANSPORT=tcp).
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;


// A hang exceeds this deadline; a mismatch must fail long before it, naming the
// mismatch (a timeout's message does not).
CommOptions mismatch_options() {
  CommOptions o = test::test_options();
  o.timeout = 15s;
  return o;
}

struct Outcome {
  bool completed = false;  // the mismatched call completed on this rank
  std::string call;        // its error, "" when it completed
  std::string next;        // when it completed: the next call's error ("" when none)
  bool peer_error = true;  // every error seen was a PeerError
};

// Each rank creates its communicator, runs `before` (correct calls, checked bit-exact
// inside), then `call` (the mismatched one), and, when that completed, a barrier. The
// ranks start `call` once all are done with `before`: a rank that fails the mismatched
// call aborts the communicator, which also fails a call that a rank behind is still in.
std::vector<Outcome> run_mismatch(int size, const std::function<void(Communicator&)>& before,
                                  const std::function<void(Communicator&)>& call) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<Outcome> out(size);
  CommOptions o = mismatch_options();
  std::mutex mu;
  std::condition_variable cv;
  int before_done = 0;
  auto done_before = [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++before_done;
    cv.notify_all();
    return cv.wait_for(lock, 60s, [&] { return before_done == size; });
  };
  auto errors = test::run_threads(size, [&](int rank) {
    auto comm = Communicator::create(store, rank, size, o);
    try {
      before(*comm);
    } catch (...) {
      done_before();
      throw;
    }
    ASSERT_TRUE(done_before()) << "the other ranks did not finish their correct calls";
    Outcome& mine = out[rank];
    try {
      call(*comm);
      mine.completed = true;
    } catch (const Error& e) {
      mine.call = e.what();
      mine.peer_error = mine.peer_error && dynamic_cast<const PeerError*>(&e) != nullptr;
    }
    if (!mine.completed) return;
    try {
      comm->barrier().wait();
    } catch (const Error& e) {
      mine.next = e.what();
      mine.peer_error = mine.peer_error && dynamic_cast<const PeerError*>(&e) != nullptr;
    }
  }, std::chrono::seconds(120));
  test::rethrow_rank_failures(errors);
  return out;
}

// `message` starts with `op` ("allreduce #1") and reports a mismatch found by a rank Y
// with a rank X (nested in an abort reason, or Y's own), saying what each called:
// "... failed on rank Y (host h): mismatch with rank X (host h...): rank X called
// <called[X]>; this rank called <called[Y]>".
void expect_mismatch(const std::string& message, const std::string& op,
                     const std::vector<std::string>& called) {
  EXPECT_EQ(message.rfind(op + " ", 0), 0u) << "does not start with '" << op << "': " << message;
  static const std::regex pair(R"(failed on rank (\d+) \(host [^)]*\): mismatch with rank (\d+) \(host )");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(message, m, pair)) << message;
  const int y = std::stoi(m[1]), x = std::stoi(m[2]);
  ASSERT_NE(x, y) << message;
  ASSERT_LT(static_cast<size_t>(std::max(x, y)), called.size()) << message;
  EXPECT_NE(called[x], called[y]) << "ranks " << x << " and " << y << " agreed: " << message;
  const std::string theirs = "rank " + std::to_string(x) + " called " + called[x] + ";";
  const std::string mine = "this rank called " + called[y] + " (";
  EXPECT_NE(message.find(theirs), std::string::npos) << "no '" << theirs << "' in: " << message;
  EXPECT_NE(message.find(mine), std::string::npos) << "no '" << mine << "' in: " << message;
}

// Every rank failed the call itself, naming the mismatch.
void expect_every_call_failed(const std::vector<Outcome>& out, const std::string& op,
                              const std::vector<std::string>& called) {
  for (size_t r = 0; r < out.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_FALSE(out[r].completed) << "the mismatched call completed; next call: '" << out[r].next << "'";
    if (!out[r].completed) expect_mismatch(out[r].call, op, called);
    EXPECT_TRUE(out[r].peer_error);
  }
}

// A correct allreduce first: integers that every reduction order sums exactly.
void correct_allreduce(Communicator& c) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 1000 + static_cast<int>(i));
  c.allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum).wait();
  const int n = c.size();
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i));
    ASSERT_EQ(v[i], want) << "element " << i;
  }
}

TEST(Mismatch, SameByteCountOfAnotherDtypeFailsEveryRank) {
  // 8 KB (over tcp: recursive doubling) and 1 MiB (the large-message algorithms): rank 0
  // passes f64, the others f32.
  for (size_t f32_count : {size_t{2000}, size_t{1} << 18}) {
    for (int size = 2; size <= 4; ++size) {
      SCOPED_TRACE("size " + std::to_string(size) + ", f32 x " + std::to_string(f32_count));
      auto out = run_mismatch(size, correct_allreduce, [&](Communicator& c) {
        if (c.rank() == 0) {
          std::vector<double> d(f32_count / 2, 1.0);
          c.allreduce(d.data(), d.size(), DataType::kFloat64, ReduceOp::kSum).wait();
        } else {
          std::vector<float> f(f32_count, 1.0f);
          c.allreduce(f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum).wait();
        }
      });
      std::vector<std::string> called(size, "allreduce #1 with f32 × " + std::to_string(f32_count) + ", sum");
      called[0] = "allreduce #1 with f64 × " + std::to_string(f32_count / 2) + ", sum";
      expect_every_call_failed(out, "allreduce #1", called);
    }
  }
}

TEST(Mismatch, SumAgainstMaxFailsEveryRank) {
  for (int size = 2; size <= 4; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    auto out = run_mismatch(size, correct_allreduce, [&](Communicator& c) {
      std::vector<float> f(500, static_cast<float>(c.rank()));
      c.allreduce(f.data(), f.size(), DataType::kFloat32, c.rank() == 1 ? ReduceOp::kMax : ReduceOp::kSum)
          .wait();
    });
    std::vector<std::string> called(size, "allreduce #1 with f32 × 500, sum");
    called[1] = "allreduce #1 with f32 × 500, max";
    expect_every_call_failed(out, "allreduce #1", called);
  }
}

TEST(Mismatch, AllgatherOfDifferentCountsFailsEveryRank) {
  for (int size = 2; size <= 4; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    auto correct_allgather = [](Communicator& c) {
      std::vector<int32_t> mine(7), all(7 * c.size());
      for (int i = 0; i < 7; ++i) mine[i] = c.rank() * 100 + i;
      c.allgather(mine.data(), all.data(), 7, DataType::kInt32).wait();
      for (int r = 0; r < c.size(); ++r) {
        for (int i = 0; i < 7; ++i) ASSERT_EQ(all[r * 7 + i], r * 100 + i) << "rank " << r << ", element " << i;
      }
    };
    auto out = run_mismatch(size, correct_allgather, [&](Communicator& c) {
      const size_t count = c.rank() == size - 1 ? 11 : 10;
      std::vector<float> mine(count, 1.0f), all(11 * size);
      c.allgather(mine.data(), all.data(), count, DataType::kFloat32).wait();
    });
    std::vector<std::string> called(size, "allgather #1 with f32 × 10");
    called[size - 1] = "allgather #1 with f32 × 11";
    expect_every_call_failed(out, "allgather #1", called);
  }
}

// Broadcasts whose ranks disagree on the root. Over tcp a rank whose part is done before
// the disagreement can reach it completes: the root it believes in (it only sends), or
// a rank that received from that root along a path of ranks that agree with it. It has
// that root's data, and its next call fails naming the mismatch. Every other rank fails
// the broadcast itself: one that receives data sent under another root, and one that
// would otherwise wait forever for a parent that never sends (its parent under its root
// is a leaf under theirs; with (1, 0) on 2 ranks nobody sends at all). With the direct
// shared-memory algorithms every rank fails the broadcast itself.
TEST(Mismatch, BroadcastWithDifferentRootsFailsEveryRank) {
  struct Case {
    std::vector<int> roots;          // each rank's root
    std::vector<int> may_complete;   // over tcp
  };
  const Case cases[] = {
      {{1, 0}, {}},            // each waits for the other, which never sends
      {{0, 1}, {0, 1}},        // each is a root, sends, and completes
      {{0, 0, 1}, {0, 1}},     // rank 2 waits for rank 1, a leaf under root 0
      {{0, 2, 0, 0}, {0, 2, 3}},  // rank 1 receives root 0's data, expecting root 2's
  };
  CommOptions o = mismatch_options();
  // 256 B (binomial tree) and 1 MiB (pipelined chain).
  for (size_t count : {size_t{64}, size_t{1} << 18}) {
    for (const Case& k : cases) {
      const int size = static_cast<int>(k.roots.size());
      std::string name = "roots";
      for (int r : k.roots) name += " " + std::to_string(r);
      SCOPED_TRACE(name + ", f32 x " + std::to_string(count));
      auto value = [](int root, size_t i) { return static_cast<float>(root * 1000003 + static_cast<int>(i)); };
      std::vector<std::vector<float>> got(size);
      auto correct_broadcast = [&](Communicator& c) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = c.rank() == 1 ? value(1, i) : -1.0f;
        c.broadcast(buf.data(), count, DataType::kFloat32, 1).wait();
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], value(1, i)) << "element " << i;
      };
      auto out = run_mismatch(size, correct_broadcast, [&](Communicator& c) {
        const int root = k.roots[c.rank()];
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = c.rank() == root ? value(root, i) : -1.0f;
        c.broadcast(buf.data(), count, DataType::kFloat32, root).wait();
        got[c.rank()] = std::move(buf);
      });
      std::vector<std::string> called(size);
      for (int r = 0; r < size; ++r) {
        called[r] = "broadcast #1 with f32 × " + std::to_string(count) + ", root " + std::to_string(k.roots[r]);
      }
      for (int r = 0; r < size; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        const Outcome& x = out[r];
        EXPECT_TRUE(x.peer_error);
        const bool may = !test::direct_shm(o) && std::find(k.may_complete.begin(), k.may_complete.end(), r) !=
                                             k.may_complete.end();
        if (!x.completed) {
          expect_mismatch(x.call, "broadcast #1", called);
          continue;
        }
        EXPECT_TRUE(may) << "the broadcast completed; next call: '" << x.next << "'";
        // Its root's data, bit-exact, and the next call names the mismatch.
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(got[r][i], value(k.roots[r], i)) << "element " << i;
        }
        expect_mismatch(x.next, "barrier #2", called);
        EXPECT_NE(x.next.find("broadcast #1"), std::string::npos) << x.next;
      }
    }
  }
}

// f32 x 100 sent, received as f64 x 50 (the same 400 bytes). The receiver fails its
// recv; the sender's send completed once its data was handed to the transport, so its
// next call fails, as does that of a rank that took no part.
TEST(Mismatch, RecvOfAnotherDtypeThanItsSendFailsEveryRank) {
  for (int size = 2; size <= 3; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    auto correct_exchange = [](Communicator& c) {
      std::vector<float> v(100);
      if (c.rank() == 0) {
        for (int i = 0; i < 100; ++i) v[i] = 0.25f * static_cast<float>(i);
        c.send(v.data(), 100, DataType::kFloat32, 1).wait();
      } else if (c.rank() == 1) {
        c.recv(v.data(), 100, DataType::kFloat32, 0).wait();
        for (int i = 0; i < 100; ++i) ASSERT_EQ(v[i], 0.25f * static_cast<float>(i)) << "element " << i;
      }
    };
    auto out = run_mismatch(size, correct_exchange, [](Communicator& c) {
      if (c.rank() == 0) {
        std::vector<float> f(100, 1.5f);
        c.send(f.data(), f.size(), DataType::kFloat32, 1).wait();
      } else if (c.rank() == 1) {
        std::vector<double> d(50);
        c.recv(d.data(), d.size(), DataType::kFloat64, 0).wait();
      }
    });
    std::vector<std::string> called(size, "nothing");
    called[0] = "send with f32 × 100";
    called[1] = "recv with f64 × 50";
    EXPECT_FALSE(out[1].completed) << "rank 1's recv completed";
    if (!out[1].completed) expect_mismatch(out[1].call, "recv #1", called);
    for (int r = 0; r < size; ++r) {
      if (r == 1) continue;
      SCOPED_TRACE("rank " + std::to_string(r));
      if (!out[r].completed) {
        expect_mismatch(out[r].call, "send #1", called);
        continue;
      }
      expect_mismatch(out[r].next, "barrier #0", called);
    }
    for (int r = 0; r < size; ++r) EXPECT_TRUE(out[r].peer_error) << "rank " << r;
  }
}

// Ranks that wait long for a late peer look further than the streams they wait on and
// tell the late peer what they wait in (over tcp, after 100 ms): with calls that agree
// that must change nothing. Before each call one rank sleeps 250 ms; every result is
// checked bit-exact, and the late rank reads the waiting frames in front of the data of
// its next calls.
TEST(Mismatch, CallsThatAgreeWithARankLateStillGiveExactResults) {
  for (int size = 2; size <= 3; ++size) {
    SCOPED_TRACE("size " + std::to_string(size));
    test::run_ranks(size, [](Communicator& c) {
      const int n = c.size(), me = c.rank();
      for (int round = 0; round < 6; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        if (me == round % n) std::this_thread::sleep_for(250ms);
        const size_t count = round % 2 == 0 ? 64 : size_t{1} << 18;
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(me * 1000 + static_cast<int>(i % 1000));
        c.allreduce(v.data(), count, DataType::kFloat32, ReduceOp::kSum).wait();
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(v[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i % 1000)))
              << "allreduce, element " << i;
        }
        const int root = round % n;
        std::vector<int32_t> b(count, me == root ? round : -1);
        c.broadcast(b.data(), count, DataType::kInt32, root).wait();
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], round) << "broadcast, element " << i;
        std::vector<int32_t> mine(5, me * 10 + round), all(5 * n);
        c.allgather(mine.data(), all.data(), 5, DataType::kInt32).wait();
        for (int r = 0; r < n; ++r) ASSERT_EQ(all[5 * r + 4], r * 10 + round) << "allgather, rank " << r;
      }
    }, mismatch_options());
  }
}

}  // namespace
}  // namespace chorus
