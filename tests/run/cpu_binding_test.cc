// Which CPUs chorusrun (and chorus-bench --np) bind each local rank to.
#include "run/cpu_binding.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace chorus::run {
namespace {

using Cpus = std::vector<int>;

TEST(CpuBinding, PoliciesParseAndPrint) {
  for (CpuBind b : {CpuBind::kAuto, CpuBind::kNone, CpuBind::kShare}) {
    EXPECT_EQ(parse_cpu_bind(cpu_bind_name(b)), b);
  }
  for (const char* bad : {"", "Auto", "core", "shared", "1"}) EXPECT_FALSE(parse_cpu_bind(bad)) << bad;
}

TEST(CpuBinding, ShareCutsTheCpusIntoNeighbouringRuns) {
  const Cpus eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(cpus_for(CpuBind::kShare, 0, 2, eight), (Cpus{0, 1, 2, 3}));
  EXPECT_EQ(cpus_for(CpuBind::kShare, 1, 2, eight), (Cpus{4, 5, 6, 7}));
  // 8 CPUs for 3 ranks: 3, 3, 2.
  EXPECT_EQ(cpus_for(CpuBind::kShare, 0, 3, eight), (Cpus{0, 1, 2}));
  EXPECT_EQ(cpus_for(CpuBind::kShare, 1, 3, eight), (Cpus{3, 4, 5}));
  EXPECT_EQ(cpus_for(CpuBind::kShare, 2, 3, eight), (Cpus{6, 7}));
  EXPECT_EQ(cpus_for(CpuBind::kShare, 0, 1, eight), eight);
  // The launcher's own CPUs, whatever their numbers.
  const Cpus odd = {1, 3, 8, 9};
  EXPECT_EQ(cpus_for(CpuBind::kShare, 1, 2, odd), (Cpus{8, 9}));
  EXPECT_EQ(cpus_for(CpuBind::kShare, 3, 4, odd), (Cpus{9}));
}

TEST(CpuBinding, MoreRanksThanCpusTakeTheCpusInTurn) {
  const Cpus two = {0, 1};
  for (CpuBind b : {CpuBind::kShare, CpuBind::kAuto}) {
    for (int r = 0; r < 5; ++r) EXPECT_EQ(cpus_for(b, r, 5, two), (Cpus{r % 2})) << "rank " << r;
  }
  EXPECT_EQ(cpus_for(CpuBind::kAuto, 2, 3, Cpus{4, 6}), (Cpus{4}));
}

TEST(CpuBinding, AutoAndNoneLeaveRanksThatFitUnbound) {
  const Cpus two = {0, 1};
  EXPECT_TRUE(cpus_for(CpuBind::kAuto, 0, 2, two).empty());
  EXPECT_TRUE(cpus_for(CpuBind::kAuto, 1, 1, two).empty());
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(cpus_for(CpuBind::kNone, r, 4, two).empty());
  // Nothing known about the CPUs, or a rank outside the node: no binding.
  EXPECT_TRUE(cpus_for(CpuBind::kShare, 0, 2, {}).empty());
  EXPECT_TRUE(cpus_for(CpuBind::kShare, 2, 2, two).empty());
  EXPECT_TRUE(cpus_for(CpuBind::kShare, -1, 2, two).empty());
}

TEST(CpuBinding, CpuListsFoldRuns) {
  EXPECT_EQ(cpu_list({}), "");
  EXPECT_EQ(cpu_list({3}), "3");
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list({0, 2, 4}), "0,2,4");
}

// allowed_cpus() is what the kernel reports for this process.
TEST(CpuBinding, AllowedCpusAreTheKernelsList) {
  std::ifstream status("/proc/self/status");
  std::string line, listed;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) listed = line.substr(line.find_first_not_of(" \t", 18));
  }
  ASSERT_FALSE(listed.empty());
  EXPECT_EQ(cpu_list(allowed_cpus()), listed);
}

}  // namespace
}  // namespace chorus::run
