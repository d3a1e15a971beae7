// bench/lockstep.h: the barrier of plain-libtorch-mnist --lockstep (compare_mnist.sh's
// sync2 config). Its ranks are threads here, each with its own mapping of the file, as
// processes have.
#include "lockstep.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using chorus::bench::Lockstep;

class LockstepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/lockstep_test.XXXXXX";
    const int fd = ::mkstemp(name);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 64), 0);
    ::close(fd);
    path_ = name;
  }
  void TearDown() override { ::unlink(path_.c_str()); }
  std::string path_;
};

// No rank leaves step s before every rank has arrived at it: each publishes its step
// before arriving and, once released, finds every other rank's at least as far.
void run_ranks(const std::string& path, int size, int64_t steps) {
  std::vector<std::atomic<int64_t>> arrived(static_cast<size_t>(size));
  for (auto& a : arrived) a = 0;
  std::atomic<int64_t> early{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      Lockstep lockstep(path, r, size, std::chrono::seconds(60));
      for (int64_t s = 1; s <= steps; ++s) {
        arrived[static_cast<size_t>(r)].store(s);
        lockstep.arrive_and_wait(s);
        for (int o = 0; o < size; ++o) {
          if (arrived[static_cast<size_t>(o)].load() < s) early.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(early.load(), 0);
}

TEST_F(LockstepTest, NoRankLeavesAStepBeforeAllArrived) {
  for (int size : {1, 2, 3, 5}) {
    SCOPED_TRACE("ranks " + std::to_string(size));
    run_ranks(path_, size, 3000);
  }
}

// One rank sleeps now and then, so that the others sleep on the futex too, not only spin.
TEST_F(LockstepTest, WaitersThatSleepAreWoken) {
  std::vector<std::thread> ranks;
  std::atomic<int64_t> passed{0};
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Lockstep lockstep(path_, r, 2, std::chrono::seconds(60));
      for (int64_t s = 1; s <= 20; ++s) {
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        lockstep.arrive_and_wait(s);
        passed.fetch_add(1);
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(passed.load(), 40);
}

TEST_F(LockstepTest, AMissingRankRunsIntoTheDeadlineNamingTheStep) {
  Lockstep lockstep(path_, 1, 2, std::chrono::seconds(1));
  try {
    lockstep.arrive_and_wait(7);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 waited 1 s at step 7 for the other 1 process(es)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LockstepTest, BadArgumentsAndFilesAreNamed) {
  EXPECT_THROW(Lockstep(path_, 2, 2, std::chrono::seconds(1)), std::invalid_argument);
  EXPECT_THROW(Lockstep(path_, -1, 2, std::chrono::seconds(1)), std::invalid_argument);
  try {
    Lockstep(path_ + ".missing", 0, 2, std::chrono::seconds(1));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open " + path_ + ".missing"), std::string::npos) << e.what();
  }
  std::ofstream(path_, std::ios::trunc) << "abc";  // 3 bytes: too short to map
  try {
    Lockstep(path_, 0, 2, std::chrono::seconds(1));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("must hold at least 8 zero bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
