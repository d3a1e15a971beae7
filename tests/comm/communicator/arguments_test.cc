// Argument checking, creation errors, abort, Work deadlines and split.
//
// The contract under test (include/chorus/communicator.h, error.h): a wrong call throws
// InvalidArgumentError from the issuing call, before any byte is sent, naming the
// operation, and leaves the communicator usable. Most wrong calls here are made by one
// rank only while the others do nothing: had the call sent anything, the correct
// allreduce that every rank runs next would see it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/expected.h"
#include "util/ranks.h"
#include "util/checks.h"

namespace chorus {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr DataType kF32 = DataType::kFloat32;
constexpr ReduceOp kSum = ReduceOp::kSum;

CommOptions short_options() {
  CommOptions options = test::test_options();
  options.timeout = seconds(30);
  options.connect_timeout = seconds(30);
  return options;
}

using chorus::test::contains;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

// Expects call() to throw InvalidArgumentError whose message names `operation`. A call
// that is accepted instead is a failure, and the communicator is aborted: its peers
// would otherwise wait for an operation that should never have been queued.
void expect_invalid(Communicator& c, const std::string& what, const std::string& operation,
                    const std::function<Work()>& call) {
  try {
    Work work = call();
    ADD_FAILURE() << what << " on rank " << c.rank()
                  << ": accepted, expected InvalidArgumentError from the issuing call";
    c.abort("test: an invalid call was accepted");
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), operation))
        << what << ": the message does not name the operation '" << operation << "': " << e.what();
    EXPECT_FALSE(e.is_fatal()) << what;
  } catch (const Error& e) {
    ADD_FAILURE() << what << " on rank " << c.rank() << ": threw " << error_kind_name(e.kind())
                  << " instead of invalid argument: " << e.what();
  }
}

// Every rank runs this after the wrong calls: a correct allreduce with exact results.
void expect_usable(Communicator& c) {
  ASSERT_FALSE(c.is_aborted()) << "rank " << c.rank();
  constexpr size_t n = 1000;
  std::vector<float> send(n), recv(n, -1.f);
  test::fill_reduce_input(kF32, kSum, c.rank(), send.data(), 0, n);
  c.allreduce(send.data(), recv.data(), n, kF32, kSum).wait();
  EXPECT_EQ(test::ReduceExpectation(kF32, kSum, c.size()).check(recv.data(), 0, n), "")
      << "allreduce after argument errors, rank " << c.rank();
}

// ----- argument errors -----

TEST(ArgumentsTest, RootOutOfRange) {
  constexpr int kSize = 3;
  test::run_ranks(kSize, [](Communicator& c) {
    std::vector<float> a(3 * 4), b(3 * 4);
    for (int root : {-1, kSize, 1000}) {
      const std::string r = " root=" + std::to_string(root);
      expect_invalid(c, "broadcast" + r, "broadcast",
                     [&] { return c.broadcast(a.data(), b.data(), 4, kF32, root); });
      expect_invalid(c, "reduce" + r, "reduce",
                     [&] { return c.reduce(a.data(), b.data(), 4, kF32, kSum, root); });
      expect_invalid(c, "gather" + r, "gather",
                     [&] { return c.gather(a.data(), b.data(), 4, kF32, root); });
      expect_invalid(c, "scatter" + r, "scatter",
                     [&] { return c.scatter(a.data(), b.data(), 4, kF32, root); });
    }
    expect_usable(c);
  }, short_options());
}

TEST(ArgumentsTest, NullBufferWithCount) {
  constexpr int kSize = 2;
  test::run_ranks(kSize, [](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> buf(kSize * 4);
      float* p = buf.data();
      expect_invalid(c, "allreduce null send", "allreduce",
                     [&] { return c.allreduce(nullptr, p, 4, kF32, kSum); });
      expect_invalid(c, "allreduce null recv", "allreduce",
                     [&] { return c.allreduce(p, nullptr, 4, kF32, kSum); });
      expect_invalid(c, "allreduce in place null", "allreduce",
                     [&] { return c.allreduce(nullptr, 4, kF32, kSum); });
      expect_invalid(c, "broadcast null send on root", "broadcast",
                     [&] { return c.broadcast(nullptr, p, 4, kF32, 0); });
      expect_invalid(c, "broadcast null recv", "broadcast",
                     [&] { return c.broadcast(p, nullptr, 4, kF32, 1); });
      expect_invalid(c, "reduce null send", "reduce",
                     [&] { return c.reduce(nullptr, p, 4, kF32, kSum, 0); });
      expect_invalid(c, "reduce null recv on root", "reduce",
                     [&] { return c.reduce(p, nullptr, 4, kF32, kSum, 0); });
      expect_invalid(c, "allgather null send", "allgather",
                     [&] { return c.allgather(nullptr, p, 4, kF32); });
      expect_invalid(c, "allgather null recv", "allgather",
                     [&] { return c.allgather(p, nullptr, 4, kF32); });
      expect_invalid(c, "reduce_scatter null send", "reduce_scatter",
                     [&] { return c.reduce_scatter(nullptr, p, 4, kF32, kSum); });
      expect_invalid(c, "reduce_scatter null recv", "reduce_scatter",
                     [&] { return c.reduce_scatter(p, nullptr, 4, kF32, kSum); });
      expect_invalid(c, "gather null recv on root", "gather",
                     [&] { return c.gather(p, nullptr, 4, kF32, 0); });
      expect_invalid(c, "gather null send", "gather",
                     [&] { return c.gather(nullptr, p, 4, kF32, 1); });
      expect_invalid(c, "scatter null send on root", "scatter",
                     [&] { return c.scatter(nullptr, p, 4, kF32, 0); });
      expect_invalid(c, "scatter null recv", "scatter",
                     [&] { return c.scatter(p, nullptr, 4, kF32, 1); });
      expect_invalid(c, "alltoall null send", "alltoall",
                     [&] { return c.alltoall(nullptr, p, 4, kF32); });
      expect_invalid(c, "alltoall null recv", "alltoall",
                     [&] { return c.alltoall(p, nullptr, 4, kF32); });
      const std::vector<size_t> counts(kSize, 4);
      expect_invalid(c, "allgatherv null recv", "allgatherv",
                     [&] { return c.allgatherv(p, 4, nullptr, counts, {}, kF32); });
      expect_invalid(c, "allgatherv null send", "allgatherv",
                     [&] { return c.allgatherv(nullptr, 4, p, counts, {}, kF32); });
      const std::vector<size_t> displs{0, 4};
      expect_invalid(c, "alltoallv null send", "alltoallv", [&] {
        return c.alltoallv(nullptr, counts, displs, p, counts, displs, kF32);
      });
      expect_invalid(c, "alltoallv null recv", "alltoallv", [&] {
        return c.alltoallv(p, counts, displs, nullptr, counts, displs, kF32);
      });
      expect_invalid(c, "send null", "send", [&] { return c.send(nullptr, 4, kF32, 1); });
      expect_invalid(c, "recv null", "recv", [&] { return c.recv(nullptr, 4, kF32, 1); });
    }
    expect_usable(c);
  }, short_options());
}

// Issue 21: 2^60 float64 elements are 2^63 bytes, which a size_t holds: the message
// says how large the buffer is and which limit it passes, not that it "overflows".
TEST(ArgumentsTest, TooLargeABufferSaysItsSizeAndTheLimit) {
  test::run_ranks(2, [](Communicator& c) {
    if (c.rank() != 0) return;
    double x = 0;
    try {
      c.allreduce(&x, &x, size_t{1} << 60, DataType::kFloat64, kSum);
      ADD_FAILURE() << "2^60 float64 elements accepted";
    } catch (const InvalidArgumentError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, "1152921504606846976 elements of f64")) << m;
      EXPECT_TRUE(contains(m, "2^63 bytes")) << m;
      EXPECT_TRUE(contains(m, "limit of 2^62 bytes")) << m;
      EXPECT_FALSE(contains(m, "overflow")) << m;
    }
    try {
      c.allreduce(&x, &x, std::numeric_limits<size_t>::max() / 2, DataType::kFloat64, kSum);
      ADD_FAILURE() << "2^63 float64 elements accepted";
    } catch (const InvalidArgumentError& e) {
      // More bytes than a size_t holds: that one does overflow, and says so.
      EXPECT_TRUE(contains(e.what(), "more than 2^64 bytes")) << e.what();
    }
  }, short_options());
}

TEST(ArgumentsTest, ByteSizeOverflow) {
  constexpr int kSize = 3;
  test::run_ranks(kSize, [](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> small(16), other(16);
      float* p = small.data();
      float* q = other.data();
      constexpr size_t kMax = std::numeric_limits<size_t>::max();
      // count * 4 bytes overflows size_t.
      const size_t huge = kMax / 2 + 1;
      // count * 4 fits in size_t, count * 4 * size does not.
      const size_t per_rank = kMax / (4 * kSize) + 1;
      expect_invalid(c, "allreduce overflow", "allreduce",
                     [&] { return c.allreduce(p, q, huge, kF32, kSum); });
      expect_invalid(c, "allreduce f64 overflow", "allreduce",
                     [&] { return c.allreduce(p, q, kMax / 8 + 1, DataType::kFloat64, kSum); });
      expect_invalid(c, "broadcast overflow", "broadcast",
                     [&] { return c.broadcast(p, q, huge, kF32, 0); });
      expect_invalid(c, "reduce overflow", "reduce",
                     [&] { return c.reduce(p, q, huge, kF32, kSum, 0); });
      expect_invalid(c, "allgather total overflow", "allgather",
                     [&] { return c.allgather(p, q, per_rank, kF32); });
      expect_invalid(c, "reduce_scatter total overflow", "reduce_scatter",
                     [&] { return c.reduce_scatter(p, q, per_rank, kF32, kSum); });
      expect_invalid(c, "gather total overflow", "gather",
                     [&] { return c.gather(p, q, per_rank, kF32, 0); });
      expect_invalid(c, "scatter total overflow", "scatter",
                     [&] { return c.scatter(p, q, per_rank, kF32, 0); });
      expect_invalid(c, "alltoall total overflow", "alltoall",
                     [&] { return c.alltoall(p, q, per_rank, kF32); });
      const std::vector<size_t> counts{huge, 1, 1};
      expect_invalid(c, "allgatherv overflow", "allgatherv",
                     [&] { return c.allgatherv(p, huge, q, counts, {}, kF32); });
      const std::vector<size_t> big_displs{0, kMax - 1, 2};
      const std::vector<size_t> ones{1, 1, 1};
      expect_invalid(c, "allgatherv displacement overflow", "allgatherv",
                     [&] { return c.allgatherv(p, 1, q, ones, big_displs, kF32); });
      expect_invalid(c, "send overflow", "send", [&] { return c.send(p, huge, kF32, 1); });
      expect_invalid(c, "recv overflow", "recv", [&] { return c.recv(p, huge, kF32, 1); });
    }
    expect_usable(c);
  }, short_options());
}

TEST(ArgumentsTest, UnknownDataTypeOrOp) {
  test::run_ranks(2, [](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> a(8), b(8);
      const auto bad_dtype = static_cast<DataType>(42);
      const auto bad_op = static_cast<ReduceOp>(42);
      expect_invalid(c, "allreduce unknown dtype", "allreduce",
                     [&] { return c.allreduce(a.data(), b.data(), 4, bad_dtype, kSum); });
      expect_invalid(c, "allreduce unknown op", "allreduce",
                     [&] { return c.allreduce(a.data(), b.data(), 4, kF32, bad_op); });
      expect_invalid(c, "broadcast unknown dtype", "broadcast",
                     [&] { return c.broadcast(a.data(), b.data(), 4, bad_dtype, 0); });
    }
    expect_usable(c);
  }, short_options());
}

// What rank a sends to b must equal what b expects from a. Here rank 0 sends 2 elements
// to rank 1, which expects 3: the call fails on every rank (rank 2 included, which is
// not involved), as InvalidArgumentError from the call or from its Work, each naming
// both sides, and nothing
// breaks: over tcp, and through shared memory where the ranks read each other's buffers
// (CHORUS_SHM_CMA=all; with 0 alltoallv goes over tcp there too).
void inconsistent_alltoallv(Communicator& c) {
  constexpr int kSize = 3;
  std::vector<size_t> send_counts(kSize, 2), recv_counts(kSize, 2);
  if (c.rank() == 1) recv_counts[0] = 3;
  std::vector<float> send(3 * kSize, 1.f), recv(3 * kSize, 0.f);
  try {
    Work work = c.alltoallv(send.data(), send_counts, {}, recv.data(), recv_counts, {}, kF32);
    const bool done = work.wait(seconds(20));
    ADD_FAILURE() << "rank " << c.rank() << ": the inconsistent alltoallv "
                  << (done ? "succeeded" : "is still running after 20 s");
    c.abort("test: inconsistent alltoallv was not refused");
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(contains(e.what(), "alltoallv")) << e.what();
    // Every rank names both sides; the others also name the rank that found it.
    EXPECT_TRUE(contains(e.what(), "rank 0 sends 2 elements to rank 1, which expects 3")) << e.what();
    EXPECT_EQ(contains(e.what(), "found by rank 1"), c.rank() != 1) << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "rank " << c.rank() << ": inconsistent alltoallv threw "
                  << error_kind_name(e.kind()) << " instead of invalid argument: " << e.what();
  }
  expect_usable(c);
  // And a consistent alltoallv works afterwards.
  const std::vector<size_t> counts(kSize, 2);
  std::vector<float> mine(2 * kSize), got(2 * kSize, -1.f);
  for (int q = 0; q < kSize; ++q) {
    for (int j = 0; j < 2; ++j) mine[2 * q + j] = static_cast<float>(100 * c.rank() + 10 * q + j);
  }
  c.alltoallv(mine.data(), counts, {}, got.data(), counts, {}, kF32).wait();
  for (int p = 0; p < kSize; ++p) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(got[2 * p + j], static_cast<float>(100 * p + 10 * c.rank() + j))
          << "rank " << c.rank() << " block from " << p;
    }
  }
}

TEST(ArgumentsTest, AlltoallvCountsInconsistentBetweenRanks) {
  for (const char* cma : {"0", "all"}) {
    SCOPED_TRACE(std::string("CHORUS_SHM_CMA=") + cma);
    setenv("CHORUS_SHM_CMA", cma, 1);
    test::run_ranks(3, [&](Communicator& c) {
      EXPECT_EQ(std::string(algorithm_name(c.algorithm_for("alltoallv", 0))),
                std::string(cma) == "all" && std::getenv("CHORUS_TRANSPORT") == nullptr ? "shm" : "auto");
      inconsistent_alltoallv(c);
    }, short_options());
  }
  unsetenv("CHORUS_SHM_CMA");
}

TEST(ArgumentsTest, AlgorithmForAMisspeltCollectiveNamesTheValidOnes) {
  test::run_ranks(2, [](Communicator& c) {
    // Every name of the enum resolves to the same choice as the enum itself.
    for (Collective k : kAllCollectives) {
      EXPECT_EQ(c.algorithm_for(collective_name(k), 4096), c.algorithm_for(k, 4096))
          << collective_name(k);
      EXPECT_EQ(parse_collective(collective_name(k)), k);
    }
    try {
      c.algorithm_for("allredcue", 4096);
      ADD_FAILURE() << "a misspelt collective was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("unknown collective 'allredcue'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("allreduce, broadcast"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(parse_collective("send/recv").has_value());
  });
}

TEST(ArgumentsTest, AllgathervShapeErrors) {
  constexpr int kSize = 3;
  test::run_ranks(kSize, [](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> send(8), recv(32);
      const std::vector<size_t> counts{2, 3, 4};
      expect_invalid(c, "allgatherv send_count != recv_counts[rank]", "allgatherv", [&] {
        return c.allgatherv(send.data(), 3, recv.data(), counts, {}, kF32);
      });
      const std::vector<size_t> short_counts{2, 3};
      expect_invalid(c, "allgatherv recv_counts of the wrong length", "allgatherv", [&] {
        return c.allgatherv(send.data(), 2, recv.data(), short_counts, {}, kF32);
      });
      const std::vector<size_t> short_displs{0, 2};
      expect_invalid(c, "allgatherv displs of the wrong length", "allgatherv", [&] {
        return c.allgatherv(send.data(), 2, recv.data(), counts, short_displs, kF32);
      });
      const std::vector<size_t> two{2, 2};
      expect_invalid(c, "alltoallv counts of the wrong length", "alltoallv", [&] {
        return c.alltoallv(send.data(), two, {}, recv.data(), counts, {}, kF32);
      });
    }
    expect_usable(c);
  }, short_options());
}

TEST(ArgumentsTest, PeerOutOfRangeOrSelf) {
  constexpr int kSize = 3;
  test::run_ranks(kSize, [](Communicator& c) {
    if (c.rank() == 1) {
      std::vector<float> buf(4);
      for (int peer : {-1, kSize, 1}) {
        const std::string p = " peer=" + std::to_string(peer);
        expect_invalid(c, "send" + p, "send", [&] { return c.send(buf.data(), 4, kF32, peer); });
        expect_invalid(c, "recv" + p, "recv", [&] { return c.recv(buf.data(), 4, kF32, peer); });
      }
    }
    expect_usable(c);
  }, short_options());
}

// A recv whose count differs from its send's breaks the contract ("a recv must match
// its send's count and dtype"); it cannot be checked before data moves, but it must
// fail within seconds (not at the operation deadline, 30 s here, and never silently),
// naming the peer, and leave the communicator aborted.
TEST(ArgumentsTest, MismatchedSendRecvCountFailsFast) {
  test::run_ranks(2, [](Communicator& c) {
    std::vector<float> buf(8, 1.f);
    if (c.rank() == 0) {
      try {
        c.send(buf.data(), 2, kF32, 1).wait();
      } catch (const Error&) {
        // The send may complete or fail: rank 1 aborts as soon as it sees the frame.
      }
    } else {
      const auto start = Clock::now();
      try {
        c.recv(buf.data(), 3, kF32, 0).wait();
        ADD_FAILURE() << "a 3-element recv matched a 2-element send";
      } catch (const Error& e) {
        EXPECT_LT(Clock::now() - start, seconds(10)) << e.what();
        EXPECT_TRUE(contains(e.what(), "rank 0")) << "does not name the sender: " << e.what();
      }
    }
    // Either rank learns of the failure: the next collective fails on both.
    float x = 1;
    EXPECT_THROW(c.allreduce(&x, 1, kF32, kSum).wait(), Error) << "rank " << c.rank();
    EXPECT_TRUE(c.is_aborted()) << "rank " << c.rank();
  }, short_options());
}

// ----- creation -----

TEST(ArgumentsTest, CreateWithBadRankOrSize) {
  auto store = std::make_shared<InMemoryStore>();
  CommOptions options = test::test_options();
  options.connect_timeout = seconds(3);
  for (auto [rank, size] : {std::pair{2, 2}, std::pair{5, 2}, std::pair{-1, 2},
                            std::pair{0, 0}, std::pair{0, -1}}) {
    const auto start = Clock::now();
    EXPECT_THROW(Communicator::create(store, rank, size, options), InvalidArgumentError)
        << "rank=" << rank << " size=" << size;
    EXPECT_LT(Clock::now() - start, seconds(2))
        << "rank=" << rank << " size=" << size << ": argument error after waiting to connect";
  }
}

TEST(ArgumentsTest, CreateWithNullStore) {
  CommOptions options = test::test_options();
  options.connect_timeout = seconds(3);
  EXPECT_THROW(Communicator::create(nullptr, 0, 1, options), InvalidArgumentError);
}

// Two ranks with different job tokens must refuse each other, each with an error that
// mentions the token, within the connect deadline (3 s, plus slack for the harness).
TEST(ArgumentsTest, JobTokenMismatchRefusesToConnect) {
  auto store = std::make_shared<InMemoryStore>();
  const auto start = Clock::now();
  auto errors = test::run_threads(2, [&](int rank) {
    CommOptions options = test::test_options();
    options.connect_timeout = seconds(3);
    options.job_token = rank == 0 ? "token-of-job-A" : "token-of-job-B";
    auto comm = Communicator::create(store, rank, 2, options);
    ADD_FAILURE() << "rank " << rank << " connected despite a different job token";
    comm->abort("test: connected with a wrong token");
  }, seconds(60));
  EXPECT_LT(Clock::now() - start, seconds(13)) << "refusal took longer than connect_timeout";
  bool any_peer_error = false;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_NE(errors[rank], nullptr) << "rank " << rank;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const Error& e) {
      EXPECT_TRUE(contains(lower(e.what()), "token"))
          << "rank " << rank << ": error does not mention the job token: " << e.what();
      any_peer_error = any_peer_error || e.kind() == ErrorKind::kPeer;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": not a chorus::Error: " << e.what();
    }
  }
  EXPECT_TRUE(any_peer_error) << "a refused handshake is a PeerError (communicator.h)";
}

TEST(ArgumentsTest, SameJobTokenConnects) {
  CommOptions options = short_options();
  options.job_token = "shared-secret";
  test::run_ranks(3, [](Communicator& c) { expect_usable(c); }, options);
}

// ----- abort -----

// Expects `work` to fail with AbortedError at once (within 2 s).
void expect_aborted(const Work& work, const std::string& what) {
  const auto start = Clock::now();
  try {
    bool done = work.wait(seconds(2));
    ADD_FAILURE() << what << ": " << (done ? "succeeded" : "still running after 2 s")
                  << ", expected AbortedError at once";
  } catch (const AbortedError&) {
    EXPECT_LT(Clock::now() - start, seconds(2)) << what;
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": failed with " << error_kind_name(e.kind())
                  << ", expected aborted: " << e.what();
  }
  EXPECT_TRUE(work.is_completed()) << what;
  EXPECT_NE(work.error(), nullptr) << what;
}

// After abort(), every call returns a Work that fails with AbortedError at once; the
// peer is told, so its pending operation fails within seconds instead of at its
// operation deadline (30 s here).
TEST(ArgumentsTest, AbortFailsEveryLaterCallAtOnce) {
  constexpr int kSize = 2;
  test::run_ranks(kSize, [](Communicator& c) {
    std::vector<float> a(kSize * 4, 1.f), b(kSize * 4);
    const std::vector<size_t> counts(kSize, 4);
    if (c.rank() == 0) {
      c.abort("aborted by the test");
      EXPECT_TRUE(c.is_aborted());
      c.abort("a second abort is harmless");
      auto check = [&](const std::string& what, const std::function<Work()>& call) {
        try {
          expect_aborted(call(), what);
        } catch (const Error& e) {
          ADD_FAILURE() << what << ": the issuing call threw " << error_kind_name(e.kind())
                        << "; an aborted communicator reports through the Work: " << e.what();
        }
      };
      check("allreduce", [&] { return c.allreduce(a.data(), b.data(), 4, kF32, kSum); });
      check("broadcast", [&] { return c.broadcast(a.data(), b.data(), 4, kF32, 0); });
      check("reduce", [&] { return c.reduce(a.data(), b.data(), 4, kF32, kSum, 0); });
      check("allgather", [&] { return c.allgather(a.data(), b.data(), 4, kF32); });
      check("allgatherv", [&] { return c.allgatherv(a.data(), 4, b.data(), counts, {}, kF32); });
      check("reduce_scatter", [&] { return c.reduce_scatter(a.data(), b.data(), 4, kF32, kSum); });
      check("gather", [&] { return c.gather(a.data(), b.data(), 4, kF32, 0); });
      check("scatter", [&] { return c.scatter(a.data(), b.data(), 4, kF32, 0); });
      check("alltoall", [&] { return c.alltoall(a.data(), b.data(), 4, kF32); });
      check("alltoallv", [&] {
        return c.alltoallv(a.data(), counts, {}, b.data(), counts, {}, kF32);
      });
      check("barrier", [&] { return c.barrier(); });
      check("send", [&] { return c.send(a.data(), 4, kF32, 1); });
      check("recv", [&] { return c.recv(a.data(), 4, kF32, 1); });
    } else {
      // Rank 0 never issues this allreduce: only the abort notice can end it early.
      const auto start = Clock::now();
      Work work = c.allreduce(a.data(), b.data(), 4, kF32, kSum);
      try {
        bool done = work.wait(seconds(20));
        ADD_FAILURE() << "rank 1's allreduce " << (done ? "succeeded" : "is still running")
                      << " although rank 0 aborted";
      } catch (const Error& e) {
        EXPECT_LT(Clock::now() - start, seconds(10))
            << "the peer's abort was noticed only after " << e.what();
        EXPECT_TRUE(e.kind() == ErrorKind::kAborted || e.kind() == ErrorKind::kPeer)
            << error_kind_name(e.kind()) << ": " << e.what();
      }
      EXPECT_TRUE(c.is_aborted()) << "rank 1 after its operation failed";
      expect_aborted(c.barrier(), "rank 1 barrier after the failure");
    }
  }, short_options());
}

// The running operation and the queued ones fail with AbortedError when abort() is
// called while they wait.
TEST(ArgumentsTest, AbortFailsRunningAndQueuedOperations) {
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_f = rank0_done.get_future().share();
  test::run_ranks(2, [&](Communicator& c) {
    std::vector<float> a(8, 1.f), b(8);
    if (c.rank() == 0) {
      Work running = c.allreduce(a.data(), b.data(), 8, kF32, kSum);
      Work queued = c.broadcast(a.data(), b.data(), 8, kF32, 0);
      Work queued2 = c.barrier();
      EXPECT_FALSE(running.wait(milliseconds(200))) << "rank 1 has not issued anything";
      c.abort("aborted by the test while operations wait");
      expect_aborted(running, "running allreduce");
      expect_aborted(queued, "queued broadcast");
      expect_aborted(queued2, "queued barrier");
      rank0_done.set_value();
    } else {
      // Stays alive (and silent) until rank 0 has checked its operations.
      EXPECT_EQ(rank0_done_f.wait_for(seconds(60)), std::future_status::ready);
    }
  }, short_options());
}

// ----- Work -----

TEST(ArgumentsTest, EmptyWorkIsCompleted) {
  Work work;
  EXPECT_TRUE(work.is_completed());
  EXPECT_EQ(work.error(), nullptr);
  EXPECT_TRUE(work.wait(milliseconds(0)));
  EXPECT_NO_THROW(work.wait());
}

// wait(timeout) returns false while the operation runs (rank 1 has not issued it yet:
// it issues only after rank 0's wait has returned), then true once it completes.
TEST(ArgumentsTest, WaitWithTimeoutOnRunningOperation) {
  std::promise<void> timed_out;
  std::shared_future<void> timed_out_f = timed_out.get_future().share();
  test::run_ranks(2, [&](Communicator& c) {
    constexpr size_t n = 64;
    std::vector<float> send(n), recv(n, -1.f);
    test::fill_reduce_input(kF32, kSum, c.rank(), send.data(), 0, n);
    if (c.rank() == 0) {
      Work work = c.allreduce(send.data(), recv.data(), n, kF32, kSum);
      EXPECT_TRUE(contains(work.description(), "allreduce")) << work.description();
      EXPECT_TRUE(contains(work.description(), "#")) << work.description();
      const auto start = Clock::now();
      EXPECT_FALSE(work.wait(milliseconds(100)));
      EXPECT_GE(Clock::now() - start, milliseconds(95)) << "wait(100 ms) returned early";
      EXPECT_FALSE(work.is_completed());
      EXPECT_EQ(work.error(), nullptr);
      timed_out.set_value();
      EXPECT_TRUE(work.wait(seconds(30)));
      EXPECT_TRUE(work.is_completed());
    } else {
      ASSERT_EQ(timed_out_f.wait_for(seconds(60)), std::future_status::ready);
      c.allreduce(send.data(), recv.data(), n, kF32, kSum).wait();
    }
    EXPECT_EQ(test::ReduceExpectation(kF32, kSum, 2).check(recv.data(), 0, n), "");
  }, short_options());
}

// Context switches, summed over this process's threads named `name`: the voluntary
// ones (the thread slept), and with `involuntary` also those where it was preempted;
// none when no thread has that name.
std::optional<int64_t> context_switches_of(const std::string& name, bool involuntary = false) {
  std::optional<int64_t> total;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    std::ifstream status(task.path() / "status");
    total = total.value_or(0);
    for (std::string line; std::getline(status, line);) {
      for (const std::string key : {"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"}) {
        if (line.rfind(key, 0) == 0 && (involuntary || key[0] == 'v')) {
          *total += std::stoll(line.substr(key.size()));
        }
      }
    }
  }
  return total;
}

// After an operation nobody waited for (as DDP's buckets during backward), the progress
// thread sleeps until the next one is issued. It once took 200 us naps for 20 ms after
// every such operation, some 40 wake-ups in every 10 ms step of a training job, each
// taking the core from the rank's computation.
TEST(ArgumentsTest, ProgressThreadSleepsAfterAnOperationNobodyWaitedFor) {
  test::run_ranks(1, [&](Communicator& c) {
    std::vector<float> data(1000, 1.f);
    // is_completed() does not run the operation: the progress thread does.
    const auto deadline = Clock::now() + seconds(30);
    auto completes = [&](const Work& work) {
      while (!work.is_completed() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
      return work.is_completed();
    };
    ASSERT_TRUE(completes(c.allreduce(data.data(), data.size(), kF32, kSum)));
    const std::optional<int64_t> before = context_switches_of("chorus-progress");
    ASSERT_TRUE(before.has_value()) << "no thread named chorus-progress";
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_LT(context_switches_of("chorus-progress").value_or(0) - *before, 20);
    // And it still wakes up for the next operation nobody waits for.
    EXPECT_TRUE(completes(c.allreduce(data.data(), data.size(), kF32, kSum)));
    EXPECT_EQ(data[0], 1.f);
  }, short_options());
}

// A caller that waits for each operation runs it itself (help()): the progress thread
// must not take it first. It once did: woken by the call, it often got there before the
// caller, and from then on it ran nearly every operation (49,960 of 50,000 64 KiB
// allreduces on one of 2 ranks in chorus-bench), each costing the caller a sleep and the
// thread a wake-up. The thread may still wake for its naps (2 ms apart).
TEST(ArgumentsTest, ProgressThreadLeavesWaitedOperationsToTheirCallers) {
  CommOptions options = short_options();
  options.transport = TransportKind::kShm;
  test::run_ranks(2, [&](Communicator& c) {
    std::vector<float> data(16 * 1024, 1.f);
    for (int i = 0; i < 100; ++i) c.allreduce(data.data(), data.size(), kF32, ReduceOp::kMax).wait();
    c.barrier().wait();
    const std::optional<int64_t> before = context_switches_of("chorus-progress", true);
    ASSERT_TRUE(before.has_value()) << "no thread named chorus-progress";
    const auto start = Clock::now();
    constexpr int kOps = 3000;
    for (int i = 0; i < kOps; ++i) c.allreduce(data.data(), data.size(), kF32, ReduceOp::kMax).wait();
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    c.barrier().wait();
    const int64_t switches = context_switches_of("chorus-progress", true).value_or(0) - *before;
    // Both ranks' threads count (this process runs both): a nap per millisecond allows
    // for both, and a tenth of the operations for the rare one taken.
    EXPECT_LT(switches, kOps / 10 + elapsed.count() + 20)
        << kOps << " operations in " << elapsed.count() << " ms";
    EXPECT_EQ(data[0], 1.f);
  }, options);
}

// The same for the rest of a small allreduce that the inline path could not finish
// (its peer came late) and left to the queue: its caller's wait() runs it. The rest was
// once queued at the coarse clock's time, up to a tick in the past, so the progress
// thread saw its claim grace long over and took each rest at once; the caller slept on
// its Work, and the thread was woken for every rest that followed (8-byte allreduces on
// 2 ranks: 39,000 context switches in 400,000 calls, 0.99 us a call against 0.36).
TEST(ArgumentsTest, ProgressThreadLeavesAnInlineRestToItsWaiter) {
  CommOptions options = short_options();
  options.transport = TransportKind::kShm;
  options.shm_inline = true;
  test::run_ranks(2, [&](Communicator& c) {
    float x = 1.f;
    for (int i = 0; i < 100; ++i) c.allreduce(&x, 1, kF32, ReduceOp::kMax).wait();
    c.barrier().wait();
    const std::optional<int64_t> before = context_switches_of("chorus-progress", true);
    ASSERT_TRUE(before.has_value()) << "no thread named chorus-progress";
    const auto start = Clock::now();
    constexpr int kOps = 400;
    for (int i = 0; i < kOps; ++i) {
      // Rank 1 comes 100 us late, far past rank 0's polls: rank 0 leaves the rest of
      // each call to the queue, then waits for it.
      if (c.rank() == 1) {
        const auto late = Clock::now() + std::chrono::microseconds(100);
        while (Clock::now() < late) {
        }
      }
      c.allreduce(&x, 1, kF32, ReduceOp::kMax).wait();
    }
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    c.barrier().wait();
    const int64_t switches = context_switches_of("chorus-progress", true).value_or(0) - *before;
    // As above: a nap per millisecond for both ranks' threads, and a tenth of the
    // operations for the rare one taken.
    EXPECT_LT(switches, kOps / 10 + elapsed.count() + 20) << kOps << " operations in " << elapsed.count() << " ms";
    EXPECT_EQ(x, 1.f);
  }, options);
}

// Sequence numbers: consecutive operations have different descriptions.
TEST(ArgumentsTest, WorkDescriptionsNameOperationAndSequence) {
  test::run_ranks(2, [](Communicator& c) {
    float x = 1;
    Work first = c.allreduce(&x, 1, kF32, kSum);
    Work second = c.barrier();
    first.wait();
    second.wait();
    EXPECT_TRUE(contains(first.description(), "allreduce")) << first.description();
    EXPECT_TRUE(contains(second.description(), "barrier")) << second.description();
    EXPECT_TRUE(contains(second.description(), "#")) << second.description();
    EXPECT_NE(first.description().substr(first.description().find('#')),
              second.description().substr(second.description().find('#')))
        << "two operations with the same sequence number";
  }, short_options());
}

// ----- split -----

// Sum over the child of (parent rank + 1): checks membership through the data.
void expect_child_allreduce(Communicator& child, int parent_rank, int64_t expected_sum) {
  int64_t value = parent_rank + 1;
  child.allreduce(&value, 1, DataType::kInt64, kSum).wait();
  EXPECT_EQ(value, expected_sum) << "child allreduce on parent rank " << parent_rank;
}

class SplitTest : public ::testing::TestWithParam<int> {};

// Even and odd ranks form two groups; key = -rank reverses the order inside each.
TEST_P(SplitTest, EvenOddWithReversedKeys) {
  const int size = GetParam();
  test::run_ranks(size, [size](Communicator& c) {
    const int color = c.rank() % 2;
    std::vector<int> members;  // parent ranks of my color, in child rank order
    for (int r = size - 1; r >= 0; --r) {
      if (r % 2 == color) members.push_back(r);
    }
    auto child = c.split(color, -c.rank());
    ASSERT_NE(child, nullptr) << "rank " << c.rank();
    EXPECT_EQ(child->size(), static_cast<int>(members.size())) << "rank " << c.rank();
    const int expected_rank =
        static_cast<int>(std::find(members.begin(), members.end(), c.rank()) - members.begin());
    EXPECT_EQ(child->rank(), expected_rank) << "parent rank " << c.rank();
    for (int r = 0; r < child->size(); ++r) EXPECT_FALSE(child->host_of(r).empty());
    int64_t sum = 0;
    for (int r : members) sum += r + 1;
    expect_child_allreduce(*child, c.rank(), sum);
    // The parent still works, interleaved with the child.
    expect_usable(c);
    expect_child_allreduce(*child, c.rank(), sum);
  }, short_options());
}

// Equal keys order by parent rank; a negative color returns nullptr but the rank still
// takes part in the exchange.
TEST_P(SplitTest, NegativeColorAndEqualKeys) {
  const int size = GetParam();
  test::run_ranks(size, [size](Communicator& c) {
    const bool excluded = c.rank() == 0;
    auto child = c.split(excluded ? -1 : 7, 0);
    if (excluded) {
      EXPECT_EQ(child, nullptr);
    } else {
      ASSERT_NE(child, nullptr) << "rank " << c.rank();
      EXPECT_EQ(child->size(), size - 1);
      EXPECT_EQ(child->rank(), c.rank() - 1);
      expect_child_allreduce(*child, c.rank(), static_cast<int64_t>(size) * (size + 1) / 2 - 1);
    }
    expect_usable(c);
  }, short_options());
}

INSTANTIATE_TEST_SUITE_P(WorldSize, SplitTest, ::testing::Values(2, 4, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace chorus
