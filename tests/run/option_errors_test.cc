// chorusrun's option parsing: every bad value is a UsageError that names the option
// and the value (split from options_test.cc, which covers the values that parse).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chorus/error.h"
#include "run/options.h"
#include "util/launch_options.h"

namespace chorus::run {
namespace {

using test::Args;
using test::usage_error;

// --- Bad values ------------------------------------------------------------------

struct ErrorCase {
  std::string name;
  Args args;
  std::vector<std::string> message_parts;  // each must appear in the message
  Environment env = {};
};

class BadValue : public testing::TestWithParam<ErrorCase> {};

TEST_P(BadValue, IsAUsageErrorNamingTheOptionAndValue) {
  std::string message = usage_error(GetParam().args, GetParam().env);
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
  }
}

const ErrorCase kErrorCases[] = {
    {"NprocZero", {"--nproc-per-node", "0", "p"}, {"--nproc-per-node 0:", ">= 1, or auto"}},
    {"NprocNegative", {"--nproc_per_node=-2", "p"}, {"--nproc-per-node -2:"}},
    {"NprocWord", {"--nproc-per-node", "two", "p"}, {"--nproc-per-node two:"}},
    {"NprocTrailing", {"--nproc-per-node", "2x", "p"}, {"--nproc-per-node 2x:"}},
    {"NprocFraction", {"--nproc-per-node", "1.5", "p"}, {"--nproc-per-node 1.5:"}},
    {"NprocEmpty", {"--nproc-per-node=", "p"}, {"--nproc-per-node \"\":"}},
    {"NprocHuge", {"--nproc-per-node", "99999999999", "p"}, {"--nproc-per-node 99999999999:"}},
    {"NprocVariable",
     {"p"},
     {"CHORUS_RUN_NPROC_PER_NODE=0:", ">= 1"},
     {{"CHORUS_RUN_NPROC_PER_NODE", "0"}}},
    {"NnodesZero", {"--nnodes", "0", "p"}, {"--nnodes 0:", ">= 1"}},
    {"NnodesFraction", {"--nnodes", "1.5", "p"}, {"--nnodes 1.5:"}},
    {"NodeRankNegative", {"--node-rank=-1", "p"}, {"--node-rank -1:", ">= 0"}},
    {"NodeRankTooLarge",
     {"--nnodes", "2", "--node-rank", "2", "p"},
     {"--node-rank 2: must be less than --nnodes (2)"}},
    {"NodeRankBeyondDefault",
     {"--node-rank", "1", "p"},
     {"--node-rank 1:", "--nnodes (1, the default)"}},
    {"NodeRankVariable",
     {"--nnodes", "2", "p"},
     {"CHORUS_RUN_NODE_RANK=5:", "--nnodes (2)"},
     {{"CHORUS_RUN_NODE_RANK", "5"}}},
    {"PortZero", {"--master-port", "0", "p"}, {"--master-port 0:", "1 to 65535"}},
    {"PortTooLarge", {"--master-port", "65536", "p"}, {"--master-port 65536:"}},
    {"PortNegative", {"--master_port=-5", "p"}, {"--master-port -5:"}},
    {"PortWord", {"--master-port", "http", "p"}, {"--master-port http:"}},
    {"MaxRestartsNegative", {"--max-restarts", "-1", "p"}, {"--max-restarts -1:", ">= 0"}},
    {"MaxRestartsFraction", {"--max-restarts", "0.5", "p"}, {"--max-restarts 0.5:"}},
    {"MonitorZero", {"--monitor-interval", "0", "p"}, {"--monitor-interval 0:", "0.001 to 3600"}},
    {"MonitorNegative", {"--monitor-interval", "-1", "p"}, {"--monitor-interval -1:"}},
    {"MonitorInfinite", {"--monitor-interval", "inf", "p"}, {"--monitor-interval inf:"}},
    {"MonitorNotANumber", {"--monitor-interval", "nan", "p"}, {"--monitor-interval nan:"}},
    {"MonitorWord", {"--monitor-interval", "fast", "p"}, {"--monitor-interval fast:"}},
    {"GraceNegative", {"--grace-period", "-0.5", "p"}, {"--grace-period -0.5:", "0 to 86400"}},
    {"GraceTooLong", {"--grace-period", "1e12", "p"}, {"--grace-period 1e12:"}},
    {"TeeFour", {"--tee", "4", "p"}, {"--tee 4:", "0 (none)", "3 (both)"}},
    {"CpuBindWord", {"--cpu-bind", "cores", "p"}, {"--cpu-bind cores:", "auto, none or share"}},
    {"CpuBindEmpty", {"--cpu_bind=", "p"}, {"--cpu-bind \"\":"}},
    {"CpuBindVariable",
     {"p"},
     {"CHORUS_RUN_CPU_BIND=yes:", "auto, none or share"},
     {{"CHORUS_RUN_CPU_BIND", "yes"}}},
    {"TeeWord", {"--tee", "both", "p"}, {"--tee both:"}},
    {"RedirectsNegative", {"--log-dir", "/l", "--redirects", "-1", "p"}, {"--redirects -1:"}},
    {"RedirectsWithoutLogDir", {"--redirects", "3", "p"}, {"--redirects 3:", "--log-dir"}},
    {"MasterAddrEmpty", {"--master-addr", "", "p"}, {"--master-addr \"\":"}},
    {"RdzvIdEmpty", {"--rdzv-id=", "p"}, {"--rdzv-id \"\":"}},
    {"StandaloneWord", {"--standalone=maybe", "p"}, {"--standalone maybe:"}},
    {"StandaloneManyNodes", {"--standalone", "--nnodes", "2", "p"}, {"--standalone", "--nnodes 2"}},
    {"StandaloneNodeRank",
     {"--standalone", "--node-rank", "1", "p"},
     {"--standalone", "--node-rank 1"}},
    {"StandaloneMasterAddr",
     {"--standalone", "--master-addr", "10.0.0.1", "p"},
     {"--standalone", "--master-addr 10.0.0.1"}},
    {"StandaloneFromVariable",
     {"--nnodes", "2", "p"},
     {"CHORUS_RUN_STANDALONE", "--nnodes 2"},
     {{"CHORUS_RUN_STANDALONE", "1"}}},
    {"WorldSizeOverflow",
     {"--nnodes", "65536", "--nproc-per-node", "65536", "p"},
     {"--nproc-per-node 65536:", "--nnodes (65536)", "world size"}},
    {"NoArguments", {}, {"no program given: usage: chorusrun [options] PROGRAM [ARGS...]"}},
    {"OptionsButNoProgram", {"--nnodes", "2", "--"}, {"no program given"}},
    {"EmptyProgram", {""}, {"no program given"}},
    {"UnknownLongOption", {"--nodes", "2", "p"}, {"unknown option --nodes"}},
    {"UnknownShortOption", {"-n", "2", "p"}, {"unknown option -n"}},
    {"ValueMissingAtTheEnd", {"--nnodes"}, {"--nnodes: needs a value"}},
    {"ValueMissingUnderscored", {"--master_port"}, {"--master_port: needs a value"}},
    {"ValueIsAnotherOption",
     {"--master-addr", "--nnodes", "2", "p"},
     {"--master-addr: needs a value (HOST) before --nnodes", "--master-addr=VALUE"}},
    {"ValueIsHelp", {"--log-dir", "-h", "p"}, {"--log-dir: needs a value (DIR) before -h"}},
    {"ValueIsTheSeparator", {"--rdzv_id", "--", "p"}, {"--rdzv_id: needs a value (ID) before --"}},
    {"ValueIsShortFlag", {"--rdzv-id", "-m", "p"}, {"--rdzv-id: needs a value (ID) before -m"}},
    {"ShortValueMissing", {"-r"}, {"-r: needs a value (0-3)"}},
    {"MasterPortExported", {"p"}, {"MASTER_PORT=29x:", "1 to 65535"}, {{"MASTER_PORT", "29x"}}},
    {"MasterPortExportedZero", {"p"}, {"MASTER_PORT=0:"}, {{"MASTER_PORT", "0"}}},
    {"MasterAddrExported", {"p"}, {"MASTER_ADDR=\"a b\":", "host name"}, {{"MASTER_ADDR", "a b"}}},
    {"MasterAddrSlash", {"--master-addr", "h/1", "p"}, {"--master-addr h/1:", "host name"}},
    {"PetNnodes", {"p"}, {"PET_NNODES=two:", ">= 1"}, {{"PET_NNODES", "two"}}},
    {"PetStandalone", {"p"}, {"PET_STANDALONE=maybe:"}, {{"PET_STANDALONE", "maybe"}}},
    {"PetTeeMapping", {"p"}, {"PET_TEE=0:3:"}, {{"PET_TEE", "0:3"}}},
    {"NnodesRangeReversed", {"--nnodes", "4:2", "p"}, {"--nnodes 4:2:", "MIN <= MAX"}},
    {"NnodesRangeWord", {"--nnodes", "a:2", "p"}, {"--nnodes a:2:", "MIN <= MAX"}},
    {"NnodesRangeEmptyEnd", {"--nnodes", "2:", "p"}, {"--nnodes 2::", "MIN <= MAX"}},
    {"BackendEtcd", {"--rdzv-backend", "etcd", "p"}, {"--rdzv-backend etcd:", "not supported", "static or c10d"}},
    {"BackendEtcdV2", {"--rdzv_backend=etcd-v2", "p"}, {"--rdzv-backend etcd-v2:", "not supported"}},
    {"BackendOther", {"--rdzv-backend", "zookeeper", "p"}, {"--rdzv-backend zookeeper:", "must be static or c10d"}},
    {"BackendVariable", {"p"}, {"PET_RDZV_BACKEND=etcd:"}, {{"PET_RDZV_BACKEND", "etcd"}}},
    {"RdzvConfUnknown", {"--rdzv-conf", "timeout=900", "p"}, {"--rdzv-conf timeout=900:", "unknown rendezvous setting", "join_timeout="}},
    {"RdzvConfBadJoin", {"--rdzv-conf", "last_call_timeout=1,join_timeout=soon", "p"}, {"--rdzv-conf join_timeout=soon:", "seconds"}},
    {"RdzvConfNoValue", {"--rdzv-conf", "join_timeout", "p"}, {"--rdzv-conf join_timeout:", "seconds"}},
    {"JoinTimeoutZero", {"--rdzv-join-timeout", "0", "p"}, {"--rdzv-join-timeout 0:", "0.1 to 86400"}},
    {"JoinAtCheckpointFixed", {"--join-at-checkpoint", "5", "p"}, {"--join-at-checkpoint 5:", "only an elastic job"}},
    {"JoinAtCheckpointNegative", {"--nnodes", "1:2", "--join-at-checkpoint", "-1", "p"}, {"--join-at-checkpoint -1:", "0 to 86400"}},
    {"RdzvConfVariable", {"p"}, {"PET_RDZV_CONF=read_timeout=60:"}, {{"PET_RDZV_CONF", "read_timeout=60"}}},
    {"EndpointBadPort", {"--rdzv-endpoint", "h:99999", "p"}, {"--rdzv-endpoint 99999:", "1 to 65535"}},
    {"EndpointNoHost", {"--rdzv-endpoint", ":29400", "p"}, {"--rdzv-endpoint :29400:", "needs a host"}},
    {"EndpointOpenBracket", {"--rdzv-endpoint", "[::1", "p"}, {"--rdzv-endpoint [::1:", "closing ]"}},
    {"EndpointContradictsAddr",
     {"--rdzv-endpoint", "a:1", "--master-addr", "b", "p"},
     {"--rdzv-endpoint a:1: contradicts --master-addr b"}},
    {"EndpointContradictsPortInVariables",
     {"p"},
     {"PET_RDZV_ENDPOINT=a:1: contradicts PET_MASTER_PORT=2"},
     {{"PET_RDZV_ENDPOINT", "a:1"}, {"PET_MASTER_PORT", "2"}}},
    {"StandaloneEndpoint",
     {"--standalone", "--rdzv-endpoint", "10.0.0.1:5", "p"},
     {"--standalone: cannot be combined with --rdzv-endpoint 10.0.0.1"}},
    {"ModuleWithoutPython", {"-m", "--no-python", "mod"}, {"--module: cannot be combined with --no-python"}},
    {"ModuleWithoutPythonVariables",
     {"mod"},
     {"CHORUS_RUN_MODULE=1: cannot be combined with PET_NO_PYTHON=1"},
     {{"CHORUS_RUN_MODULE", "1"}, {"PET_NO_PYTHON", "1"}}},
    {"LocalRankArgWithUseEnv",
     {"--use-env", "--local-rank-arg", "p"},
     {"--local-rank-arg: cannot be combined with --use-env"}},
};

INSTANTIATE_TEST_SUITE_P(Options, BadValue, testing::ValuesIn(kErrorCases),
                         [](const auto& info) { return info.param.name; });

// chorus's error policy (chorus/error.h) holds in the launcher too: a bad option is a
// ConfigError, which chorusrun reports as a usage error.
TEST(UsageError, IsAChorusConfigError) {
  try {
    test::parse({"--nnodes", "0", "p"});
    FAIL() << "--nnodes 0 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(dynamic_cast<const UsageError*>(&e), nullptr) << e.what();
  }
}

}  // namespace
}  // namespace chorus::run
