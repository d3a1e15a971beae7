#include "run/cluster_env.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>

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

using Args = std::vector<std::string>;

LaunchOptions parse(const Args& args, const Environment& env) {
  return parse_options(args, env, 4);
}

std::string options_error(const Args& args, const Environment& env) {
  try {
    parse(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
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

// --- Slurm: steps, ports, tasks per node, the token ---------------------------------

// What srun gives a task of `srun -N2 -n2` (taken from Slurm 22.05), on node `node`.
Environment srun_task(int node) {
  return {{"SLURM_JOB_ID", "4711"},           {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},    {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_NNODES", "2"},               {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_NTASKS", "2"},               {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_TASKS_PER_NODE", "1(x2)"},   {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_NODEID", std::to_string(node)}, {"SLURM_LOCALID", "0"},
          {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.9"}};
}

// `srun -N1 -w n2` inside a job of n[1-2]: a step of one node, whose node 0 is n2.
TEST(SlurmCluster, TheStepsNodesComeFirst) {
  Environment env = {{"SLURM_JOB_ID", "9"},           {"SLURM_STEP_ID", "1"},
                     {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_NODELIST", "n[1-2]"},
                     {"SLURM_STEP_NODELIST", "n2"},    {"SLURM_JOB_NUM_NODES", "2"},
                     {"SLURM_STEP_NUM_NODES", "1"},    {"SLURM_NNODES", "1"},
                     {"SLURM_NODEID", "0"}};
  auto info = detect_cluster(env);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->master_addr, "n2");
  EXPECT_EQ(info->source.at("master_addr"), "SLURM_STEP_NODELIST");
  EXPECT_EQ(info->nnodes, 1);
  EXPECT_EQ(info->source.at("nnodes"), "SLURM_STEP_NUM_NODES");
  EXPECT_TRUE(info->refusal.empty()) << info->refusal;
}

TEST(SlurmCluster, ThePortFollowsTheJobId) {
  EXPECT_EQ(slurm_port("4711"), 29500 + 711);
  EXPECT_EQ(slurm_port("1000"), 29500);
  EXPECT_EQ(slurm_port("999"), 30499);
  // Not a number (no Slurm makes one, but a user may export it): hashed into the range.
  std::set<uint16_t> ports;
  for (const char* id : {"a", "b", "job-1", "job-2", "4711x"}) {
    uint16_t port = slurm_port(id);
    EXPECT_GE(port, kSlurmPortBase) << id;
    EXPECT_LT(port, kSlurmPortBase + kSlurmPorts) << id;
    ports.insert(port);
  }
  EXPECT_GT(ports.size(), 1u);

  LaunchOptions o = parse({"prog"}, srun_task(0));
  EXPECT_EQ(o.master_port, 30211);
  EXPECT_EQ(o.source.at("master_port"), "SLURM_JOB_ID");
  Environment next = srun_task(0);
  next["SLURM_JOB_ID"] = "4712";
  EXPECT_EQ(parse({"prog"}, next).master_port, 30212);
  // Any port given above the cluster wins.
  EXPECT_EQ(parse({"--master-port", "1234", "prog"}, srun_task(0)).master_port, 1234);
  Environment exported = srun_task(0);
  exported["MASTER_PORT"] = "29999";
  EXPECT_EQ(parse({"prog"}, exported).master_port, 29999);
}

// `srun -N1 -n2 chorusrun`: both tasks say node 0 of 1; both must refuse.
TEST(SlurmCluster, TwoTasksOnOneNodeAreRefused) {
  Environment env = {{"SLURM_JOB_ID", "2"},          {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_NODELIST", "n1"},    {"SLURM_STEP_NODELIST", "n1"},
                     {"SLURM_NNODES", "1"},           {"SLURM_STEP_NUM_NODES", "1"},
                     {"SLURM_NTASKS", "2"},           {"SLURM_STEP_NUM_TASKS", "2"},
                     {"SLURM_TASKS_PER_NODE", "2"},   {"SLURM_STEP_TASKS_PER_NODE", "2"},
                     {"SLURM_NODEID", "0"}};
  for (const char* local_id : {"0", "1"}) {
    env["SLURM_LOCALID"] = local_id;
    std::string message = options_error({"prog"}, env);
    EXPECT_TRUE(has(message, "SLURM_STEP_TASKS_PER_NODE=2")) << message;
    EXPECT_TRUE(has(message, "one chorusrun per node")) << message;
    EXPECT_TRUE(has(message, "--ntasks-per-node=1")) << message;
    EXPECT_TRUE(has(message, "--nproc-per-node")) << message;
  }
  // Nodes given by hand are the user's to place.
  EXPECT_EQ(parse({"--nnodes", "2", "--node-rank", "1", "prog"}, env).node_rank, 1);
}

// Each variable that tells alone, as older or other Slurm versions may set fewer.
TEST(SlurmCluster, EachSignOfSeveralTasksPerNodeIsEnough) {
  const std::pair<Environment, std::string> cases[] = {
      {{{"SLURM_TASKS_PER_NODE", "1,2"}}, "SLURM_TASKS_PER_NODE=1,2"},
      {{{"SLURM_STEP_TASKS_PER_NODE", "1(x3),2(x2)"}}, "SLURM_STEP_TASKS_PER_NODE=1(x3),2(x2)"},
      {{{"SLURM_NTASKS", "3"}, {"SLURM_NNODES", "2"}}, "SLURM_NTASKS=3 > SLURM_NNODES=2"},
      {{{"SLURM_NTASKS_PER_NODE", "2"}}, "SLURM_NTASKS_PER_NODE=2"},
      {{{"SLURM_LOCALID", "1"}}, "SLURM_LOCALID=1"},
  };
  for (const auto& [extra, evidence] : cases) {
    Environment env = {{"SLURM_JOB_ID", "5"}, {"SLURM_STEPID", "0"}, {"SLURM_NODEID", "0"}};
    env.insert(extra.begin(), extra.end());
    std::string message = options_error({"prog"}, env);
    EXPECT_TRUE(has(message, evidence)) << message;
    EXPECT_TRUE(has(message, "--ntasks-per-node=1")) << message;
  }
  // One task per node, as srun -N2 -n2 gives it.
  Environment fine = srun_task(1);
  fine["SLURM_NTASKS_PER_NODE"] = "1";
  LaunchOptions o = parse({"prog"}, fine);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n1");
}

TEST(SlurmCluster, MalformedTasksPerNodeNamesTheVariable) {
  for (const char* text : {"2(x", "(x2)", "2(x)", "2,,1", "two", "2(x2"}) {
    Environment env = srun_task(0);
    env["SLURM_STEP_TASKS_PER_NODE"] = text;
    EXPECT_EQ(cluster_error(env), "SLURM_STEP_TASKS_PER_NODE=" + std::string(text) +
                                      ": must be task counts such as 2(x3),1");
  }
}

// chorusrun straight in the batch script (no step): fine for one node; for two, the
// second node's launcher would never come.
TEST(SlurmCluster, TheBatchScriptOfSeveralNodesIsRefused) {
  Environment batch = {{"SLURM_JOB_ID", "3"},           {"SLURM_JOB_NODELIST", "n[1-2]"},
                       {"SLURM_NNODES", "2"},           {"SLURM_NODEID", "0"},
                       {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NTASKS", "4"}};
  std::string message = options_error({"prog"}, batch);
  EXPECT_TRUE(has(message, "batch script of a job of 2 nodes (SLURM_NNODES)")) << message;
  EXPECT_TRUE(has(message, "srun --ntasks-per-node=1")) << message;
  batch["SLURM_NNODES"] = "1";
  batch["SLURM_JOB_NODELIST"] = "n1";
  EXPECT_EQ(parse({"prog"}, batch).nnodes, 1);
}

TEST(SlurmCluster, ThePublicJobIdAsTokenIsWarnedAbout) {
  LaunchOptions o = parse({"prog"}, srun_task(0));
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_TRUE(has(o.warnings[0], "job token is the Slurm job id 4711 (SLURM_JOB_ID)"))
      << o.warnings[0];
  EXPECT_TRUE(has(o.warnings[0], "CHORUS_JOB_TOKEN")) << o.warnings[0];
  Environment secret = srun_task(0);
  secret["CHORUS_JOB_TOKEN"] = "s3cret";
  EXPECT_TRUE(parse({"prog"}, secret).warnings.empty());
  EXPECT_TRUE(parse({"--rdzv-id", "mine", "prog"}, srun_task(0)).warnings.empty());
}

// --- mpirun across hosts ---------------------------------------------------------------

TEST(MpirunCluster, ALoopbackMasterAcrossHostsIsRefused) {
  Environment env = {{"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}};
  std::string message = options_error({"prog"}, env);
  EXPECT_TRUE(has(message, "OMPI_COMM_WORLD_LOCAL_SIZE=1 of OMPI_COMM_WORLD_SIZE=2")) << message;
  EXPECT_TRUE(has(message, "--master-addr (127.0.0.1, the default)")) << message;
  EXPECT_TRUE(has(message, "--master-addr HOST")) << message;
  Environment exported = env;
  exported["MASTER_ADDR"] = "localhost";
  message = options_error({"prog"}, exported);
  EXPECT_TRUE(has(message, "MASTER_ADDR (localhost)")) << message;
  // Without the local size nothing shows that the launchers share a host.
  // A given address, or all launchers on one host, is fine.
  EXPECT_EQ(parse({"--master-addr", "10.0.0.1", "prog"}, env).master_addr, "10.0.0.1");
  Environment one_host = env;
  one_host["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  EXPECT_EQ(parse({"prog"}, one_host).master_addr, "127.0.0.1");
  // Without the local size nothing shows that the launchers share a host.
  env.erase("OMPI_COMM_WORLD_LOCAL_SIZE");
  message = options_error({"prog"}, env);
  EXPECT_TRUE(has(message, "no OMPI_COMM_WORLD_LOCAL_SIZE")) << message;
  EXPECT_EQ(parse({"prog"}, {{"OMPI_COMM_WORLD_SIZE", "1"}}).nnodes, 1);
}

// --- settle_master_addr ------------------------------------------------------------

// A lookup that resolves only `known` and knows Slurm NodeAddrs `node_addrs`; records
// the names asked of Slurm.
struct FakeHosts {
  std::set<std::string> known;
  std::map<std::string, std::string> node_addrs;
  std::vector<std::string> asked;
  HostLookup lookup() {
    return {[this](const std::string& h) { return known.count(h) > 0; },
            [this](const std::string& n) -> std::optional<std::string> {
              asked.push_back(n);
              auto it = node_addrs.find(n);
              if (it == node_addrs.end()) return std::nullopt;
              return it->second;
            }};
  }
};

std::string settle_error(LaunchOptions& o, const Environment& env, FakeHosts& hosts) {
  try {
    settle_master_addr(o, env, hosts.lookup());
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(SettleMasterAddr, ANameThatResolvesStays) {
  FakeHosts hosts{{"n1"}, {{"n1", "10.0.0.1"}}, {}};
  LaunchOptions o = parse({"prog"}, srun_task(1));
  settle_master_addr(o, srun_task(1), hosts.lookup());
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_TRUE(hosts.asked.empty());
}

TEST(SettleMasterAddr, SlurmsNodeAddrComesFirst) {
  FakeHosts hosts{{"10.0.0.1", "10.0.0.9"}, {{"n1", "10.0.0.1"}}, {}};
  LaunchOptions o = parse({"prog"}, srun_task(1));
  settle_master_addr(o, srun_task(1), hosts.lookup());
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.source.at("master_addr"), "NodeAddr of n1 (scontrol show node)");
  EXPECT_EQ(hosts.asked, Hosts{"n1"});
}

TEST(SettleMasterAddr, ThenTheLaunchNodesAddressWithAWarning) {
  FakeHosts hosts{{"10.0.0.9"}, {{"n1", "n1"}}, {}};  // NodeAddr defaults to the name
  LaunchOptions o = parse({"prog"}, srun_task(1));
  size_t warnings = o.warnings.size();
  settle_master_addr(o, srun_task(1), hosts.lookup());
  EXPECT_EQ(o.master_addr, "10.0.0.9");
  EXPECT_EQ(o.source.at("master_addr"), "SLURM_LAUNCH_NODE_IPADDR");
  ASSERT_EQ(o.warnings.size(), warnings + 1);
  EXPECT_TRUE(has(o.warnings.back(), "master host 'n1' (first host of SLURM_STEP_NODELIST)"))
      << o.warnings.back();
}

// Every node sees the same names and fails the same way, at once.
TEST(SettleMasterAddr, NoAddressAtAllIsAnErrorNamingTheName) {
  for (int node : {0, 1}) {
    FakeHosts hosts;
    Environment env = srun_task(node);
    env.erase("SLURM_LAUNCH_NODE_IPADDR");
    LaunchOptions o = parse({"prog"}, env);
    std::string message = settle_error(o, env, hosts);
    EXPECT_TRUE(has(message, "cannot resolve the master address 'n1' (first host of "
                             "SLURM_STEP_NODELIST)")) << message;
    EXPECT_TRUE(has(message, "SLURM_LAUNCH_NODE_IPADDR is not set")) << message;
    EXPECT_TRUE(has(message, "--master-addr")) << message;
  }
}

TEST(SettleMasterAddr, AGivenNameIsCheckedWithoutAskingSlurm) {
  FakeHosts hosts{{"10.0.0.9"}, {{"typo", "10.0.0.1"}}, {}};
  LaunchOptions o = parse({"--master-addr", "typo", "prog"}, srun_task(1));
  std::string message = settle_error(o, srun_task(1), hosts);
  EXPECT_TRUE(has(message, "cannot resolve the master address 'typo' (--master-addr)")) << message;
  EXPECT_TRUE(hosts.asked.empty());
  LaunchOptions plain = parse({"--nnodes", "2", "--master-addr", "typo", "prog"}, {});
  EXPECT_TRUE(has(settle_error(plain, {}, hosts), "'typo' (--master-addr)"));
}

}  // namespace
}  // namespace chorus::run
