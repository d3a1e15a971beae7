// The direct path of the collectives on node-shared buffers
// (include/chorus/shared_memory.h; the buffers themselves are tested in
// tests/comm/shared/), with ranks as threads (the failure cases with real processes, a
// killed rank and the peers' mappings, are in process_test).
//
// Ranks that are threads of one process find each other's buffers at their owners'
// addresses (peer_files.h), so ThreadSanitizer sees every direct read and write of a
// peer's buffer against the owner's own accesses: the "slow and fast rank" case below,
// run under it by scripts/sanitize.sh, is the check that no rank reads a peer's buffer
// after that peer could have overwritten it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "util/expected.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using test::contains;

// Runs body(comm) on `size` rank threads of one node; rethrows the first failure.
void run_ranks(int size, const std::function<void(Communicator&)>& body, CommOptions options = {}) {
  auto store = std::make_shared<InMemoryStore>();
  auto errors = test::run_threads(size, [&](int rank) {
    auto comm = Communicator::create(store, rank, size, options);
    body(*comm);
  });
  test::rethrow_rank_failures(errors);
}

// Every rank's f32 input, different on every rank, with sums that round: the direct
// path and the segment path must add them in the same (rank) order.
float value(size_t i, int r) { return 1.0f + static_cast<float>((i * 2654435761u + 97u * r) % 1000) / 999.0f; }

// Allreduce, in place and out of place, on node-shared buffers, on 1 to 8 ranks and
// counts from 0 to beyond a buffer's worth of pieces, against the same allreduce on
// ordinary buffers: the same bytes on every rank, and the same bytes as the segment
// path, which adds in rank order too.
TEST(SharedMemory, AllreduceMatchesTheSegmentPathBitForBit) {
  for (int size = 1; size <= 8; ++size) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{17}, size_t{16385}, size_t{300001}}) {
      SCOPED_TRACE("size " + std::to_string(size) + ", count " + std::to_string(count));
      run_ranks(size, [&](Communicator& c) {
        const size_t bytes = std::max<size_t>(count, 1) * sizeof(float);
        auto in = allocate_shared(bytes), out = allocate_shared(bytes);
        auto* x = static_cast<float*>(in->data());
        std::vector<float> ordinary(std::max<size_t>(count, 1));
        for (size_t i = 0; i < count; ++i) ordinary[i] = x[i] = value(i, c.rank());
        c.allreduce(x, out->data(), count, DataType::kFloat32, ReduceOp::kSum).wait();
        c.allreduce(x, count, DataType::kFloat32, ReduceOp::kSum).wait();  // in place
        c.allreduce(ordinary.data(), count, DataType::kFloat32, ReduceOp::kSum).wait();
        if (count > 0) {
          EXPECT_EQ(std::memcmp(x, ordinary.data(), count * sizeof(float)), 0) << "in place";
          EXPECT_EQ(std::memcmp(out->data(), ordinary.data(), count * sizeof(float)), 0) << "out of place";
        }
      });
    }
  }
}

// Every dtype and op on the direct path, in place, against the patterns' expectation.
TEST(SharedMemory, AllreduceEveryDtypeAndOp) {
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                             DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
  for (int size : {2, 3, 5}) {
    for (DataType t : dtypes) {
      for (ReduceOp op : ops) {
        SCOPED_TRACE("size " + std::to_string(size) + " " + dtype_name(t) + " op " +
                     std::to_string(static_cast<int>(op)));
        const size_t count = 40003;
        run_ranks(size, [&](Communicator& c) {
          auto buf = allocate_shared(count * dtype_size(t));
          test::fill_reduce_input(t, op, c.rank(), buf->data(), 0, count);
          c.allreduce(buf->data(), count, t, op).wait();
          const double tol = t == DataType::kFloat16 || t == DataType::kBFloat16 ? 1e-2 : 1e-5;
          EXPECT_EQ(test::ReduceExpectation(t, op, size).count_wrong(buf->data(), 0, count, tol), 0u);
        });
      }
    }
  }
}

// reduce_scatter and allgather in place, and broadcast from every root, on 1 to 8 ranks.
TEST(SharedMemory, ReduceScatterAllgatherBroadcastInPlace) {
  for (int size = 1; size <= 8; ++size) {
    for (size_t block : {size_t{1}, size_t{5}, size_t{20001}}) {
      SCOPED_TRACE("size " + std::to_string(size) + ", block " + std::to_string(block));
      run_ranks(size, [&](Communicator& c) {
        const int me = c.rank();
        const size_t total = block * size;
        auto buf = allocate_shared(total * sizeof(float));
        auto* x = static_cast<float*>(buf->data());
        std::vector<float> ordinary(total);
        for (size_t i = 0; i < total; ++i) ordinary[i] = x[i] = value(i, me);
        c.reduce_scatter(x, x + me * block, block, DataType::kFloat32, ReduceOp::kSum).wait();
        c.reduce_scatter(ordinary.data(), ordinary.data() + me * block, block, DataType::kFloat32,
                         ReduceOp::kSum).wait();
        EXPECT_EQ(std::memcmp(x + me * block, ordinary.data() + me * block, block * sizeof(float)), 0);
        // Allgather the reduced blocks back: every rank then holds the whole sum.
        c.allgather(x + me * block, x, block, DataType::kFloat32).wait();
        c.allgather(ordinary.data() + me * block, ordinary.data(), block, DataType::kFloat32).wait();
        EXPECT_EQ(std::memcmp(x, ordinary.data(), total * sizeof(float)), 0);
        for (int root = 0; root < size; ++root) {
          for (size_t i = 0; i < total; ++i) x[i] = value(i, me) + static_cast<float>(root);
          c.broadcast(x, total, DataType::kFloat32, root).wait();
          size_t wrong = 0;
          for (size_t i = 0; i < total; ++i) wrong += x[i] != value(i, root) + static_cast<float>(root);
          EXPECT_EQ(wrong, 0u) << "root " << root;
        }
      });
    }
  }
}

// Ranks of which one passes node-shared buffers and the other ordinary ones fail a call
// large enough for the direct path, each naming the other and what it passed.
TEST(SharedMemory, RanksThatDisagreeOnTheKindOfBufferFailNamingIt) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> messages(2);
  test::run_threads(2, [&](int rank) {
    auto c = Communicator::create(store, rank, 2, CommOptions{});
    auto shared = allocate_shared(1 << 20);
    std::vector<float> ordinary(1 << 18, 1.0f);
    void* buf = rank == 0 ? shared->data() : ordinary.data();
    try {
      c->allreduce(buf, 1 << 18, DataType::kFloat32, ReduceOp::kSum).wait();
    } catch (const PeerError& e) {
      messages[rank] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(messages[r], "node-shared buffers")) << r << ": " << messages[r];
    EXPECT_TRUE(contains(messages[r], "ordinary buffers")) << r << ": " << messages[r];
    EXPECT_TRUE(contains(messages[r], "rank " + std::to_string(1 - r))) << r << ": " << messages[r];
  }
}

// CHORUS_SHM_DIRECT=0 (CommOptions::shm_direct): node-shared buffers are ordinary
// memory, so a rank with them and a rank without agree; and so they do in a call too
// small for the direct path (the cost model's cut-off, about 16 KiB), with it on.
TEST(SharedMemory, DirectPathOffTreatsThemAsOrdinaryMemory) {
  for (bool on : {false, true}) {
    CommOptions o;
    o.shm_direct = on;
    const int count = on ? 64 : 1 << 18;
    run_ranks(2, [&](Communicator& c) {
      auto shared = allocate_shared(count * sizeof(float));
      std::vector<float> ordinary(count);
      auto* buf = c.rank() == 0 ? static_cast<float*>(shared->data()) : ordinary.data();
      for (int i = 0; i < count; ++i) buf[i] = static_cast<float>(c.rank() + i);
      c.allreduce(buf, count, DataType::kFloat32, ReduceOp::kSum).wait();
      for (int i = 0; i < count; ++i) ASSERT_EQ(buf[i], static_cast<float>(1 + 2 * i));
    }, o);
  }
}

// direct_path_possible(): ranks of one node in shared memory with the path on and no
// flat algorithm forced (one rank per node: chorus_torch's ddp_shared_test).
TEST(SharedMemory, DirectPathPossibleOnlyWhereTheRanksMeetInSharedMemory) {
  auto possible = [](int size, CommOptions o) {
    std::vector<int> answers(size, -1);
    run_ranks(size, [&](Communicator& c) { answers[c.rank()] = c.direct_path_possible(); }, o);
    return answers;
  };
  CommOptions on, off, tcp, ring;
  off.shm_direct = false;
  tcp.transport = TransportKind::kTcp;
  ring.algorithm = Algorithm::kRing;
  EXPECT_EQ(possible(3, on), std::vector<int>(3, 1));
  EXPECT_EQ(possible(1, on), std::vector<int>(1, 0));
  EXPECT_EQ(possible(2, off), std::vector<int>(2, 0));
  EXPECT_EQ(possible(2, tcp), std::vector<int>(2, 0));
  EXPECT_EQ(possible(2, ring), std::vector<int>(2, 0));
}

// One rank slow to enter and one fast, in place, over and over: the fast rank
// overwrites its buffer as soon as its call returns, and fills it anew only after a
// delay, so a peer that still read it after the return would sum garbage. Every result
// must be exact (small integers). Under ThreadSanitizer (scripts/sanitize.sh) the
// same run checks every such read against the owner's writes. Two sizes: one the
// issuing thread runs itself when its peers are there (the inline path, up to 256 KiB;
// otherwise its rest is queued), and one always queued for the runner role.
TEST(SharedMemory, NoRankReadsAPeerBufferAfterItsOwnerCouldOverwriteIt) {
  for (int size : {2, 3})
  for (size_t count : {size_t{3 * 16384 + 7}, size_t{3 * 65536 + 7}}) {  // several pieces, one partial
    SCOPED_TRACE(std::to_string(size) + " ranks, " + std::to_string(count) + " floats");
    run_ranks(size, [&](Communicator& c) {
      auto buf = allocate_shared(count * sizeof(float));
      auto* x = static_cast<float*>(buf->data());
      std::mt19937 rng(static_cast<unsigned>(c.rank()) * 7919u + 1u);
      for (int iter = 0; iter < 60; ++iter) {
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(c.rank() + 1 + (i + iter) % 3);
        // Alternately the slow one: the others enter and wait for it.
        if (iter % size == c.rank()) {
          std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng)));
        }
        c.allreduce(x, count, DataType::kFloat32, ReduceOp::kSum).wait();
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          wrong += x[i] != static_cast<float>(size * (size + 1) / 2 + size * static_cast<int>((i + iter) % 3));
        }
        ASSERT_EQ(wrong, 0u) << "iteration " << iter << " rank " << c.rank();
        for (size_t i = 0; i < count; ++i) x[i] = -1e30f;  // overwritten at once
      }
    });
  }
}

// A freed buffer's place is reused by a new one between two collectives: the second
// collective uses the new buffer, not a stale view of the old.
TEST(SharedMemory, ReallocatedBuffersAreUsedNotStaleViews) {
  run_ranks(3, [&](Communicator& c) {
    for (int round = 0; round < 5; ++round) {
      auto buf = allocate_shared(100000 * sizeof(int32_t));
      auto* x = static_cast<int32_t*>(buf->data());
      for (int i = 0; i < 100000; ++i) x[i] = round * 10 + c.rank();
      c.allreduce(x, 100000, DataType::kInt32, ReduceOp::kSum).wait();
      for (int i = 0; i < 100000; ++i) ASSERT_EQ(x[i], round * 30 + 3) << round;
    }
  });
}

}  // namespace
}  // namespace chorus
