#include "run/options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>

#include "util/launch_options.h"

namespace chorus::run {
namespace {

using test::Args;
using test::joined;
using test::parse;
using test::usage_error;
using std::chrono::milliseconds;
using std::chrono::milliseconds;


const Environment kSlurm = {{"SLURM_JOB_ID", "4711"},
                            {"SLURM_STEP_ID", "0"},
                            {"SLURM_NNODES", "4"},
                            {"SLURM_NODEID", "2"},
                            {"SLURM_JOB_NODELIST", "node[01-03,07]"}};

TEST(Options, DefaultsWhenOnlyTheProgramIsGiven) {
  LaunchOptions o = parse({"train"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.monitor_interval, milliseconds(100));
  EXPECT_EQ(o.rdzv_id, "none");
  EXPECT_EQ(o.log_dir, "");
  EXPECT_EQ(o.tee, Streams::kNone);
  EXPECT_EQ(o.redirects, Streams::kNone);
  EXPECT_EQ(o.local_addr, "");
  EXPECT_EQ(o.grace_period, milliseconds(5000));
  EXPECT_EQ(o.cpu_bind, CpuBind::kAuto);
  EXPECT_EQ(o.rdzv_backend, "static");
  EXPECT_EQ(o.rdzv_endpoint, "");
  EXPECT_FALSE(o.module);
  EXPECT_FALSE(o.no_python);
  EXPECT_EQ(o.python, "");
  EXPECT_FALSE(o.use_env);
  EXPECT_FALSE(o.local_rank_arg);
  EXPECT_TRUE(o.warnings.empty());
  EXPECT_EQ(o.program, "train");
  EXPECT_TRUE(o.program_args.empty());
  EXPECT_EQ(o.source.size(), 25u);
  for (const auto& [key, source] : o.source) EXPECT_EQ(source, "default") << key;
}

// --- Every option, in every spelling ---------------------------------------------

struct OptionCase {
  std::string name;   // dashed, without "--"
  std::string value;  // empty for the flag
  Args context;       // other options the value needs to be valid
  std::function<void(const LaunchOptions&)> check;
};

std::string underscored(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string variable(const std::string& name, const std::string& prefix = "CHORUS_RUN_") {
  std::string upper = prefix + underscored(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper;
}

const OptionCase kOptionCases[] = {
    {"nproc-per-node", "3", {}, [](auto& o) { EXPECT_EQ(o.nproc_per_node, 3); }},
    {"nnodes", "4", {}, [](auto& o) { EXPECT_EQ(o.nnodes, 4); }},
    {"node-rank", "2", {"--nnodes", "3"}, [](auto& o) { EXPECT_EQ(o.node_rank, 2); }},
    {"master-addr", "10.1.2.3", {}, [](auto& o) { EXPECT_EQ(o.master_addr, "10.1.2.3"); }},
    {"master-port", "12345", {}, [](auto& o) { EXPECT_EQ(o.master_port, 12345); }},
    {"standalone",
     "",
     {},
     [](auto& o) {
       EXPECT_TRUE(o.standalone);
       EXPECT_EQ(o.source.at("master_addr"), o.source.at("standalone"));
     }},
    {"max-restarts", "2", {}, [](auto& o) { EXPECT_EQ(o.max_restarts, 2); }},
    {"monitor-interval",
     "0.25",
     {},
     [](auto& o) { EXPECT_EQ(o.monitor_interval, milliseconds(250)); }},
    {"rdzv-id", "job42", {}, [](auto& o) { EXPECT_EQ(o.rdzv_id, "job42"); }},
    {"log-dir", "/tmp/logs", {}, [](auto& o) { EXPECT_EQ(o.log_dir, "/tmp/logs"); }},
    {"tee", "3", {}, [](auto& o) { EXPECT_EQ(o.tee, Streams::kBoth); }},
    {"redirects",
     "2",
     {"--log-dir", "/l"},
     [](auto& o) { EXPECT_EQ(o.redirects, Streams::kStderr); }},
    {"local-addr", "127.0.0.2", {}, [](auto& o) { EXPECT_EQ(o.local_addr, "127.0.0.2"); }},
    {"grace-period", "1.5", {}, [](auto& o) { EXPECT_EQ(o.grace_period, milliseconds(1500)); }},
    {"cpu-bind", "share", {}, [](auto& o) { EXPECT_EQ(o.cpu_bind, CpuBind::kShare); }},
    {"rdzv-backend", "c10d", {}, [](auto& o) { EXPECT_EQ(o.rdzv_backend, "c10d"); }},
    {"rdzv-endpoint",
     "10.0.0.9:2345",
     {},
     [](auto& o) {
       EXPECT_EQ(o.master_addr, "10.0.0.9");
       EXPECT_EQ(o.master_port, 2345);
       EXPECT_EQ(o.source.at("master_addr"), o.source.at("rdzv_endpoint"));
       EXPECT_EQ(o.source.at("master_port"), o.source.at("rdzv_endpoint"));
     }},
    {"module", "", {}, [](auto& o) { EXPECT_TRUE(o.module); }},
    {"no-python", "", {}, [](auto& o) { EXPECT_TRUE(o.no_python); }},
    {"python", "/opt/py/bin/python3", {}, [](auto& o) { EXPECT_EQ(o.python, "/opt/py/bin/python3"); }},
    {"use-env", "", {}, [](auto& o) { EXPECT_TRUE(o.use_env); }},
    {"local-rank-arg", "", {}, [](auto& o) { EXPECT_TRUE(o.local_rank_arg); }},
};

// The options torchrun does not have, and so no PET_ variable: chorusrun's own, and
// torch.distributed.launch's --use-env.
bool chorus_only(const std::string& name) {
  for (const char* own : {"grace-period", "cpu-bind", "python", "use-env", "local-rank-arg"}) {
    if (name == own) return true;
  }
  return false;
}

class EveryOption : public testing::TestWithParam<OptionCase> {
 protected:
  bool is_flag() const { return GetParam().value.empty(); }

  // Parses context + `given` + a program, and checks the value and its recorded source.
  void expect_read(const Args& given, const Environment& env, const std::string& source) {
    const OptionCase& c = GetParam();
    Args args = c.context;
    args.insert(args.end(), given.begin(), given.end());
    args.push_back("prog");
    LaunchOptions o = parse(args, env);
    c.check(o);
    EXPECT_EQ(o.source.at(underscored(c.name)), source) << joined(args);
    EXPECT_EQ(o.program, "prog");
  }

  Args spelled(const std::string& flag) const {
    return is_flag() ? Args{flag} : Args{flag, GetParam().value};
  }
  std::string with_equals(const std::string& flag) const {
    return flag + "=" + (is_flag() ? "1" : GetParam().value);
  }
};

TEST_P(EveryOption, WithDashes) {
  expect_read(spelled("--" + GetParam().name), {}, "--" + GetParam().name);
}

TEST_P(EveryOption, WithUnderscores) {
  expect_read(spelled("--" + underscored(GetParam().name)), {}, "--" + GetParam().name);
}

TEST_P(EveryOption, WithEqualsSign) {
  expect_read({with_equals("--" + GetParam().name)}, {}, "--" + GetParam().name);
  expect_read({with_equals("--" + underscored(GetParam().name))}, {}, "--" + GetParam().name);
}

TEST_P(EveryOption, FromItsEnvironmentVariable) {
  std::string name = variable(GetParam().name);
  expect_read({}, {{name, is_flag() ? "1" : GetParam().value}}, name);
}

TEST_P(EveryOption, CommandLineBeatsEnvironmentVariable) {
  // The variable holds a bad value: reading it would throw.
  expect_read(spelled("--" + GetParam().name), {{variable(GetParam().name), "bad"}},
              "--" + GetParam().name);
}

// torchrun's own variable, a default below the command line and CHORUS_RUN_.
TEST_P(EveryOption, FromItsPetVariableAsTorchrunReadsIt) {
  std::string name = variable(GetParam().name, "PET_");
  std::string value = is_flag() ? "1" : GetParam().value;
  if (chorus_only(GetParam().name)) {
    // Not torchrun's option: a PET_ variable of that name is not chorusrun's to read.
    Args args = GetParam().context;
    args.push_back("prog");
    EXPECT_EQ(parse(args, {{name, value}}).source.at(underscored(GetParam().name)), "default");
    return;
  }
  expect_read({}, {{name, value}}, name);
}

TEST_P(EveryOption, ChorusVariableBeatsPetVariable) {
  std::string value = is_flag() ? "1" : GetParam().value;
  expect_read({}, {{variable(GetParam().name), value}, {variable(GetParam().name, "PET_"), "bad"}},
              variable(GetParam().name));
}

INSTANTIATE_TEST_SUITE_P(Options, EveryOption, testing::ValuesIn(kOptionCases),
                         [](const auto& info) { return underscored(info.param.name); });

// --- The program and its arguments -------------------------------------------------

TEST(Options, ArgumentsAfterTheProgramAreItsOwnVerbatim) {
  LaunchOptions o = parse({"--nnodes", "1", "prog", "--lr", "0.1", "--nnodes", "5", "-h", "--",
                           "--help", "", "--foo=bar"});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.program_args,
            (Args{"--lr", "0.1", "--nnodes", "5", "-h", "--", "--help", "", "--foo=bar"}));
}

TEST(Options, DoubleDashEndsTheOptions) {
  LaunchOptions o = parse({"--nproc-per-node", "2", "--", "--odd-program", "--nnodes", "3"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.program, "--odd-program");
  EXPECT_EQ(o.program_args, (Args{"--nnodes", "3"}));
}

TEST(Options, EmptyValueAfterEqualsDoesNotTakeTheProgram) {
  LaunchOptions o = parse({"--log-dir=", "--local_addr=", "prog", "x"});
  EXPECT_EQ(o.log_dir, "");
  EXPECT_EQ(o.local_addr, "");
  EXPECT_EQ(o.source.at("log_dir"), "--log-dir");
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.program_args, Args{"x"});
}

TEST(Options, ValueMayStartWithADash) {
  EXPECT_EQ(parse({"--rdzv-id", "-job", "prog"}).rdzv_id, "-job");
  EXPECT_EQ(parse({"--rdzv-id=--job", "prog"}).rdzv_id, "--job");
  std::string message = usage_error({"--node-rank", "-1", "prog"});
  EXPECT_NE(message.find("--node-rank -1:"), std::string::npos) << message;
}

TEST(Options, LastRepetitionWins) {
  LaunchOptions o =
      parse({"--nnodes", "2", "--nnodes=3", "--node_rank", "1", "--node-rank", "2", "prog"});
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
}

TEST(Options, HelpBeforeTheProgramIsRequested) {
  EXPECT_THROW(parse({"-h"}), HelpRequested);
  EXPECT_THROW(parse({"--help"}), HelpRequested);
  EXPECT_THROW(parse({"--nnodes", "2", "--help", "prog"}), HelpRequested);
  EXPECT_EQ(parse({"prog", "--help"}).program_args, Args{"--help"});
}

TEST(Options, VersionBeforeTheProgramIsRequested) {
  EXPECT_THROW(parse({"--version"}), VersionRequested);
  EXPECT_THROW(parse({"--nnodes", "2", "--version", "prog"}), VersionRequested);
  EXPECT_EQ(parse({"prog", "--version"}).program_args, Args{"--version"});
}

TEST(Options, AutoProcessesPerNodeIsTheCpuCount) {
  EXPECT_EQ(parse({"--nproc-per-node", "auto", "prog"}, {}, 7).nproc_per_node, 7);
  EXPECT_EQ(parse({"prog"}, {{"CHORUS_RUN_NPROC_PER_NODE", "auto"}}, 3).nproc_per_node, 3);
  // A machine that reports no CPUs still runs one worker.
  EXPECT_EQ(parse({"--nproc_per_node=auto", "prog"}, {}, 0).nproc_per_node, 1);
}

// --- Environment variables and precedence -----------------------------------------

TEST(Options, EmptyVariableCountsAsUnset) {
  LaunchOptions o = parse({"prog"}, {{"CHORUS_RUN_NNODES", ""}, {"CHORUS_RUN_MASTER_ADDR", ""}});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.source.at("nnodes"), "default");
}

TEST(Options, StandaloneVariableTakesBooleanWords) {
  EXPECT_TRUE(parse({"prog"}, {{"CHORUS_RUN_STANDALONE", "true"}}).standalone);
  EXPECT_FALSE(parse({"prog"}, {{"CHORUS_RUN_STANDALONE", "0"}}).standalone);
  std::string message = usage_error({"prog"}, {{"CHORUS_RUN_STANDALONE", "maybe"}});
  EXPECT_NE(message.find("CHORUS_RUN_STANDALONE=maybe"), std::string::npos) << message;
}

TEST(Options, StandaloneFlagCanBeTurnedOffWithAValue) {
  EXPECT_FALSE(parse({"--standalone=0", "prog"}).standalone);
  EXPECT_FALSE(parse({"--standalone=false", "prog"}, {{"CHORUS_RUN_STANDALONE", "1"}}).standalone);
}

TEST(Options, VariablesBeatTheCluster) {
  Environment env = kSlurm;
  env["CHORUS_RUN_NNODES"] = "3";
  env["CHORUS_RUN_MASTER_ADDR"] = "head";
  LaunchOptions o = parse({"prog"}, env);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.source.at("nnodes"), "CHORUS_RUN_NNODES");
  EXPECT_EQ(o.master_addr, "head");
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.source.at("node_rank"), "SLURM_NODEID");
}

TEST(Options, CommandLineBeatsTheCluster) {
  LaunchOptions o =
      parse({"--nnodes", "1", "--node-rank", "0", "--master-addr", "h", "--rdzv-id", "r", "prog"},
            kSlurm);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "h");
  EXPECT_EQ(o.rdzv_id, "r");
  EXPECT_EQ(o.source.at("rdzv_id"), "--rdzv-id");
}

// --- torchrun's variables, exported MASTER_ADDR/MASTER_PORT --------------------------

// Each level in turn: command line > CHORUS_RUN_ > PET_ > MASTER_PORT > default.
TEST(Options, MasterPortPrecedence) {
  Environment env = {{"CHORUS_RUN_MASTER_PORT", "2001"},
                     {"PET_MASTER_PORT", "2002"},
                     {"MASTER_PORT", "2003"}};
  const std::pair<const char*, uint16_t> levels[] = {{"CHORUS_RUN_MASTER_PORT", 2001},
                                                     {"PET_MASTER_PORT", 2002},
                                                     {"MASTER_PORT", 2003}};
  LaunchOptions top = parse({"--master-port", "2000", "prog"}, env);
  EXPECT_EQ(top.master_port, 2000);
  EXPECT_EQ(top.source.at("master_port"), "--master-port");
  for (const auto& [name, port] : levels) {
    LaunchOptions o = parse({"prog"}, env);
    EXPECT_EQ(o.master_port, port) << name;
    EXPECT_EQ(o.source.at("master_port"), name);
    env.erase(name);
  }
  EXPECT_EQ(parse({"prog"}, env).master_port, 29500);
}

TEST(Options, ExportedMasterAddressIsTheDefaultAndBeatsTheCluster) {
  EXPECT_EQ(parse({"prog"}, {{"MASTER_ADDR", "head"}}).master_addr, "head");
  Environment env = kSlurm;
  env["MASTER_ADDR"] = "head";
  LaunchOptions o = parse({"prog"}, env);
  EXPECT_EQ(o.master_addr, "head");
  EXPECT_EQ(o.source.at("master_addr"), "MASTER_ADDR");
  EXPECT_EQ(o.nnodes, 4);  // the rest still comes from Slurm
  env["PET_MASTER_ADDR"] = "pet-head";
  EXPECT_EQ(parse({"prog"}, env).master_addr, "pet-head");
  env["CHORUS_RUN_MASTER_ADDR"] = "chorus-head";
  EXPECT_EQ(parse({"prog"}, env).master_addr, "chorus-head");
  EXPECT_EQ(parse({"--master-addr", "cli", "prog"}, env).master_addr, "cli");
  EXPECT_EQ(parse({"prog"}, {{"MASTER_ADDR", ""}}).source.at("master_addr"), "default");
}

TEST(Options, PetVariablesAsAJobControllerSetsThem) {
  LaunchOptions o = parse({"prog"}, {{"PET_NPROC_PER_NODE", "4"},
                                     {"PET_NNODES", "3"},
                                     {"PET_NODE_RANK", "2"},
                                     {"PET_MASTER_ADDR", "job-master-0"},
                                     {"PET_MASTER_PORT", "23456"}});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "job-master-0");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_EQ(o.source.at("node_rank"), "PET_NODE_RANK");
}

// torchrun's standalone runs on this machine: an exported MASTER_PORT still chooses
// the store's port (it is never replaced silently), an exported MASTER_ADDR naming
// another host is left aside with a warning.
TEST(Options, StandaloneTakesMasterPortAndWarnsAboutMasterAddr) {
  LaunchOptions o = parse({"--standalone", "prog"}, {{"MASTER_PORT", "29555"}, {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(o.master_port, 29555);
  EXPECT_EQ(o.source.at("master_port"), "MASTER_PORT");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_EQ(o.warnings[0], "MASTER_ADDR=10.0.0.1 is not used: --standalone runs on 127.0.0.1");
  EXPECT_TRUE(parse({"--standalone", "prog"}, {{"MASTER_ADDR", "127.0.0.1"}}).warnings.empty());
  EXPECT_TRUE(parse({"prog"}, {{"MASTER_ADDR", "10.0.0.1"}}).warnings.empty());
  EXPECT_EQ(parse({"--standalone", "prog"}, {{"MASTER_PORT", "0"}}).master_port, 0);
}

TEST(Options, NodeRangeWithEqualEndsIsThatNumber) {
  EXPECT_EQ(parse({"--nnodes", "2:2", "prog"}).nnodes, 2);
  EXPECT_EQ(parse({"--nnodes", "2:2", "prog"}).min_nnodes, 2);
  EXPECT_FALSE(parse({"--nnodes", "2:2", "prog"}).elastic());
  EXPECT_FALSE(parse({"--nnodes", "3", "prog"}).elastic());
  EXPECT_EQ(parse({"--nnodes=1:1", "prog"}).nnodes, 1);
  EXPECT_EQ(parse({"prog"}, {{"PET_NNODES", "3:3"}}).nnodes, 3);
}

// An elastic range: MIN and MAX, and the rendezvous timeouts from --rdzv-join-timeout
// or torchrun's --rdzv-conf (the dedicated option wins).
TEST(Options, ElasticRangeAndItsTimeouts) {
  // Only node rank 0 means something (it hosts the store): any other is accepted.
  EXPECT_EQ(parse({"--nnodes", "2:4", "--node-rank", "9", "prog"}).node_rank, 9);
  LaunchOptions o = parse({"--nnodes", "2:4", "--node-rank", "3", "prog"});
  EXPECT_TRUE(o.elastic());
  EXPECT_EQ(o.min_nnodes, 2);
  EXPECT_EQ(o.nnodes, 4);
  EXPECT_EQ(o.join_timeout, std::chrono::seconds(30));
  EXPECT_EQ(o.last_call, std::chrono::seconds(2));
  o = parse({"--rdzv-conf", "join_timeout=7.5,last_call_timeout=0", "prog"}, {{"PET_NNODES", "1:2"}});
  EXPECT_EQ(o.min_nnodes, 1);
  EXPECT_EQ(o.join_timeout, std::chrono::milliseconds(7500));
  EXPECT_EQ(o.last_call, std::chrono::milliseconds(0));
  o = parse({"--rdzv-conf", "join_timeout=7", "--rdzv-join-timeout", "3", "prog"});
  EXPECT_EQ(o.join_timeout, std::chrono::seconds(3));
  EXPECT_EQ(parse({"prog"}, {{"CHORUS_RUN_RDZV_JOIN_TIMEOUT", "12"}}).join_timeout,
            std::chrono::seconds(12));
}

TEST(Options, EndpointIsTheMasterAddressAndPortAtItsLevel) {
  LaunchOptions host_only = parse({"--rdzv-endpoint", "head", "--master-port", "1234", "prog"});
  EXPECT_EQ(host_only.master_addr, "head");
  EXPECT_EQ(host_only.master_port, 1234);
  EXPECT_EQ(host_only.source.at("master_addr"), "--rdzv-endpoint");
  LaunchOptions v6 = parse({"--rdzv_endpoint=[::1]:29400", "prog"});
  EXPECT_EQ(v6.master_addr, "::1");
  EXPECT_EQ(v6.master_port, 29400);
  EXPECT_EQ(parse({"--rdzv-endpoint", "fe80::1", "prog"}).master_addr, "fe80::1");
  // The same value twice at one level is no contradiction.
  EXPECT_EQ(parse({"--rdzv-endpoint", "h:5", "--master-addr", "h", "prog"}).master_port, 5);
  // A higher level beats it, and it beats a lower one.
  EXPECT_EQ(parse({"--master-addr", "cli", "prog"}, {{"PET_RDZV_ENDPOINT", "pet:7"}}).master_addr,
            "cli");
  LaunchOptions pet = parse({"prog"}, {{"PET_RDZV_ENDPOINT", "pet:7"}, {"MASTER_ADDR", "m"},
                                       {"MASTER_PORT", "8"}});
  EXPECT_EQ(pet.master_addr, "pet");
  EXPECT_EQ(pet.master_port, 7);
  EXPECT_EQ(pet.source.at("master_port"), "PET_RDZV_ENDPOINT");
}

TEST(Options, FlagsOfTorchrunAndTorchDistributedLaunch) {
  LaunchOptions m = parse({"--nproc-per-node", "2", "-m", "pkg.train", "--lr", "1"});
  EXPECT_TRUE(m.module);
  EXPECT_EQ(m.program, "pkg.train");
  EXPECT_EQ(m.program_args, (Args{"--lr", "1"}));
  EXPECT_EQ(m.nproc_per_node, 2);
  LaunchOptions shorts = parse({"--log-dir", "/l", "-r", "3", "-t", "2", "prog"});
  EXPECT_EQ(shorts.redirects, Streams::kBoth);
  EXPECT_EQ(shorts.tee, Streams::kStderr);
  EXPECT_TRUE(parse({"--use_env", "prog"}).use_env);
  EXPECT_TRUE(parse({"--no_python", "prog.py"}).no_python);
  // After the program, the same spellings are the program's own.
  EXPECT_EQ(parse({"prog", "-m", "x"}).program_args, (Args{"-m", "x"}));
  EXPECT_FALSE(parse({"prog", "-m", "x"}).module);
}

// --- Clusters ------------------------------------------------------------------------

TEST(Options, SlurmFillsWhatIsNotGiven) {
  LaunchOptions o = parse({"prog"}, kSlurm);
  EXPECT_EQ(o.nnodes, 4);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "node01");
  EXPECT_EQ(o.rdzv_id, "4711");
  EXPECT_EQ(o.source.at("nnodes"), "SLURM_NNODES");
  EXPECT_EQ(o.source.at("master_addr"), "SLURM_JOB_NODELIST");
  EXPECT_EQ(o.source.at("rdzv_id"), "SLURM_JOB_ID");
  EXPECT_EQ(o.master_port, 30211);
  EXPECT_EQ(o.source.at("master_port"), "SLURM_JOB_ID");
}

TEST(Options, MpirunFillsNodesButNotTheMasterAddress) {
  Environment env = {{"OMPI_COMM_WORLD_SIZE", "3"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  LaunchOptions o = parse({"prog"}, env);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.source.at("node_rank"), "OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.source.at("master_addr"), "default");
  EXPECT_EQ(parse({"--master-addr", "n0", "prog"}, env).master_addr, "n0");
}

TEST(Options, StandaloneIgnoresTheCluster) {
  LaunchOptions o = parse({"--standalone", "--master-port", "0", "prog"}, kSlurm);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);  // picked later by the launcher
  EXPECT_EQ(o.rdzv_id, "none");
  EXPECT_EQ(o.source.at("nnodes"), "--standalone");
  EXPECT_EQ(o.source.at("master_port"), "--master-port");
}

TEST(Options, UnreadableClusterDoesNotBlockExplicitValues) {
  Environment env = kSlurm;
  env["SLURM_JOB_NODELIST"] = "node[01";
  std::string message = usage_error({"prog"}, env);
  EXPECT_NE(message.find("SLURM_JOB_NODELIST"), std::string::npos) << message;
  LaunchOptions o = parse(
      {"--nnodes", "2", "--node-rank", "1", "--master-addr", "n", "--rdzv-id", "j", "prog"}, env);
  EXPECT_EQ(o.master_addr, "n");
}

TEST(Options, ClusterValuesAreChecked) {
  Environment env = kSlurm;
  env["SLURM_NODEID"] = "4";
  EXPECT_EQ(usage_error({"prog"}, env), "SLURM_NODEID=4: must be less than SLURM_NNODES (4)");
}

// --- Help ------------------------------------------------------------------------------

TEST(Options, UsageListsEveryOptionWithDefaultAndVariable) {
  std::string text = usage_text();
  for (const OptionCase& c : kOptionCases) {
    EXPECT_NE(text.find("--" + c.name), std::string::npos) << c.name;
    EXPECT_NE(text.find(variable(c.name)), std::string::npos) << c.name;
  }
  EXPECT_NE(text.find("default: 29500"), std::string::npos);
  EXPECT_NE(text.find("SLURM_JOB_NODELIST"), std::string::npos);
  EXPECT_NE(text.find("OMPI_COMM_WORLD_RANK"), std::string::npos);
  EXPECT_NE(text.find("-h, --help"), std::string::npos);
  for (const OptionCase& c : kOptionCases) {
    EXPECT_EQ(text.find(variable(c.name, "PET_")) != std::string::npos, !chorus_only(c.name))
        << c.name;
  }
  for (const char* part : {"-m, --module", "-r, --redirects", "-t, --tee", "PET_RDZV_CONF",
                           "MASTER_PORT", "CHORUS_STORE_PORT", "--local_rank=N"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part;
  }
}

TEST(Options, CurrentEnvironmentReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("CHORUS_OPTIONS_TEST_VAR", "a=b", 1), 0);
  Environment env = current_environment();
  unsetenv("CHORUS_OPTIONS_TEST_VAR");
  EXPECT_EQ(env.at("CHORUS_OPTIONS_TEST_VAR"), "a=b");
}

}  // namespace
}  // namespace chorus::run
