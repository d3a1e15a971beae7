#include "run/cluster_env.h"

#include <gtest/gtest.h>

#include <chrono>

namespace chorus::run {
namespace {

using Hosts = std::vector<std::string>;

// The message of the UsageError that expand_nodelist must throw.
std::string nodelist_error(const std::string& list) {
  try {
    expand_nodelist(list);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for \"" << list << "\"";
  return "";
}

std::string cluster_error(const Environment& env) {
  try {
    detect_cluster(env);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

// --- detect_cluster ----------------------------------------------------------------

TEST(DetectCluster, NothingWithoutAScheduler) {
  EXPECT_FALSE(detect_cluster({}).has_value());
  EXPECT_FALSE(detect_cluster({{"SLURM_NNODES", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}).has_value());
  EXPECT_FALSE(detect_cluster({{"SLURM_JOB_ID", ""}}).has_value());
}

TEST(DetectCluster, SlurmMapsNodesRankFirstHostAndJob) {
  auto info = detect_cluster({{"SLURM_JOB_ID", "4711"},
                              {"SLURM_NNODES", "4"},
                              {"SLURM_NODEID", "3"},
                              {"SLURM_JOB_NODELIST", "node[01-03,07]"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->scheduler, "slurm");
  EXPECT_EQ(info->nnodes, 4);
  EXPECT_EQ(info->node_rank, 3);
  EXPECT_EQ(info->master_addr, "node01");
  EXPECT_EQ(info->job_id, "4711");
  EXPECT_EQ(info->source.at("nnodes"), "SLURM_NNODES");
  EXPECT_EQ(info->source.at("node_rank"), "SLURM_NODEID");
  EXPECT_EQ(info->source.at("master_addr"), "SLURM_JOB_NODELIST");
  EXPECT_EQ(info->source.at("rdzv_id"), "SLURM_JOB_ID");
}

TEST(DetectCluster, SlurmFallbackVariables) {
  auto info = detect_cluster(
      {{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_NODELIST", "gpu[7-8]"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->nnodes, 2);
  EXPECT_EQ(info->source.at("nnodes"), "SLURM_JOB_NUM_NODES");
  EXPECT_EQ(info->master_addr, "gpu7");
  EXPECT_EQ(info->source.at("master_addr"), "SLURM_NODELIST");
  EXPECT_FALSE(info->node_rank.has_value());
}

TEST(DetectCluster, SlurmPrefersTheJobVariables) {
  auto info = detect_cluster({{"SLURM_JOB_ID", "9"},
                              {"SLURM_NNODES", "3"},
                              {"SLURM_JOB_NUM_NODES", "2"},
                              {"SLURM_JOB_NODELIST", "a,b,c"},
                              {"SLURM_NODELIST", "z"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->nnodes, 3);
  EXPECT_EQ(info->master_addr, "a");
}

TEST(DetectCluster, SlurmWithOnlyTheJobId) {
  auto info = detect_cluster({{"SLURM_JOB_ID", "9"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->nnodes.has_value());
  EXPECT_FALSE(info->node_rank.has_value());
  EXPECT_FALSE(info->master_addr.has_value());
  EXPECT_EQ(info->job_id, "9");
}

TEST(DetectCluster, MpirunMapsWorldToNodes) {
  auto info = detect_cluster({{"OMPI_COMM_WORLD_SIZE", "5"}, {"OMPI_COMM_WORLD_RANK", "4"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->scheduler, "mpirun");
  EXPECT_EQ(info->nnodes, 5);
  EXPECT_EQ(info->node_rank, 4);
  EXPECT_FALSE(info->master_addr.has_value());
  EXPECT_FALSE(info->job_id.has_value());
  EXPECT_EQ(info->source.at("nnodes"), "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(info->source.at("node_rank"), "OMPI_COMM_WORLD_RANK");
}

TEST(DetectCluster, MpirunInsideSlurmIsMpirun) {
  auto info = detect_cluster({{"SLURM_JOB_ID", "9"},
                              {"SLURM_NODEID", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_RANK", "1"}});
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->scheduler, "mpirun");
  EXPECT_EQ(info->node_rank, 1);
}

TEST(DetectCluster, MalformedValuesNameTheVariable) {
  EXPECT_EQ(cluster_error({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "two"}}),
            "SLURM_NNODES=two: must be a whole number >= 1");
  EXPECT_EQ(cluster_error({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NUM_NODES", "0"}}),
            "SLURM_JOB_NUM_NODES=0: must be a whole number >= 1");
  EXPECT_EQ(cluster_error({{"SLURM_JOB_ID", "1"}, {"SLURM_NODEID", "-1"}}),
            "SLURM_NODEID=-1: must be a whole number >= 0");
  EXPECT_EQ(cluster_error({{"OMPI_COMM_WORLD_SIZE", "4x"}}),
            "OMPI_COMM_WORLD_SIZE=4x: must be a whole number >= 1");
  EXPECT_EQ(cluster_error({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "1.0"}}),
            "OMPI_COMM_WORLD_RANK=1.0: must be a whole number >= 0");
  std::string message = cluster_error({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}});
  EXPECT_EQ(message.rfind("SLURM_JOB_NODELIST: host list \"n[1-\"", 0), 0u) << message;
}

// --- expand_nodelist -----------------------------------------------------------------

TEST(ExpandNodelist, PlainHosts) {
  EXPECT_EQ(expand_nodelist("node7"), Hosts{"node7"});
  EXPECT_EQ(expand_nodelist("a,b.example.com,c-1"), (Hosts{"a", "b.example.com", "c-1"}));
}

TEST(ExpandNodelist, RangesAndListsKeepZeroPadding) {
  EXPECT_EQ(expand_nodelist("node[01-03,07]"), (Hosts{"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(expand_nodelist("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_nodelist("n[08-11]"), (Hosts{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand_nodelist("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_nodelist("n[007,5]"), (Hosts{"n007", "n5"}));
  EXPECT_EQ(expand_nodelist("n[3-3]"), Hosts{"n3"});
}

TEST(ExpandNodelist, TextAfterAndBetweenGroups) {
  EXPECT_EQ(expand_nodelist("a[1-2]b"), (Hosts{"a1b", "a2b"}));
  EXPECT_EQ(expand_nodelist("[1-2]x"), (Hosts{"1x", "2x"}));
  EXPECT_EQ(expand_nodelist("rack[1-2]-node[3-4]"),
            (Hosts{"rack1-node3", "rack1-node4", "rack2-node3", "rack2-node4"}));
  EXPECT_EQ(expand_nodelist("r[1-2]n[3-4]"), (Hosts{"r1n3", "r1n4", "r2n3", "r2n4"}));
}

TEST(ExpandNodelist, SeveralItemsInOrder) {
  EXPECT_EQ(expand_nodelist("node[01-03,07],gpu5,a[1-2]b"),
            (Hosts{"node01", "node02", "node03", "node07", "gpu5", "a1b", "a2b"}));
  EXPECT_EQ(expand_nodelist("b[2],a[1]"), (Hosts{"b2", "a1"}));
}

TEST(ExpandNodelist, MalformedListsAreRejectedWithTheReason) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "empty"},
      {"node[01-03", "'[' without ']'"},
      {"node01-03]", "']' without '['"},
      {"a[1[2]]", "nested '['"},
      {"a,,b", "empty item"},
      {",a", "empty item"},
      {"a,", "empty item"},
      {"a[]", "empty brackets"},
      {"a[1,]", "\"\" is not a number"},
      {"a[,1]", "\"\" is not a number"},
      {"a[3-1]", "range 3-1 is reversed"},
      {"a[x-2]", "\"x\" is not a number"},
      {"a[1-y]", "\"y\" is not a number"},
      {"a[1-2-3]", "\"2-3\" is not a number"},
      {"a[-2]", "\"\" is not a number"},
      {"a[1- 2]", "\" 2\" is not a number"},
      {"a[1-1234567890123456789]", "too long"},
  };
  for (const auto& [list, reason] : cases) {
    std::string message = nodelist_error(list);
    EXPECT_NE(message.find(reason), std::string::npos) << list << ": " << message;
    EXPECT_NE(message.find("host list \"" + list + "\""), std::string::npos) << message;
  }
}

TEST(ExpandNodelist, AtMostOneHundredThousandHosts) {
  Hosts hosts = expand_nodelist("n[1-100000]");
  ASSERT_EQ(hosts.size(), 100000u);
  EXPECT_EQ(hosts.back(), "n100000");
  EXPECT_EQ(expand_nodelist("a[1-50000],b[1-49999],c").size(), 100000u);
  EXPECT_NE(nodelist_error("n[1-100001]").find("more than 100000 hosts"), std::string::npos);
  EXPECT_NE(nodelist_error("a[1-50000],b[1-50000],c").find("more than 100000 hosts"),
            std::string::npos);
  EXPECT_NE(nodelist_error("a[1-1000]b[1-1000]").find("more than 100000 hosts"), std::string::npos);
}

TEST(ExpandNodelist, HugeListsAreRejectedBeforeBeingGenerated) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_NE(nodelist_error("n[0-999999999999999999]").find("more than"), std::string::npos);
  EXPECT_NE(nodelist_error("a[1-999999]b[1-999999]c[1-999999]d[1-999999]").find("more than"),
            std::string::npos);
  // Generating even the first of these would take minutes and gigabytes.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(ExpandNodelist, LongListsAreShortenedInMessages) {
  std::string list = std::string(500, 'a') + "[";
  std::string message = nodelist_error(list);
  EXPECT_LT(message.size(), 300u) << message;
  EXPECT_NE(message.find("'[' without ']'"), std::string::npos) << message;
}

}  // namespace
}  // namespace chorus::run
