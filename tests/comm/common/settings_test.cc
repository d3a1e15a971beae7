// Environment settings: defaults, chorus names over HCCL fallbacks, bad values, and
// the interface selection rules of CHORUS_SOCKET_IFNAME.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "chorus/communicator.h"
#include "chorus/error.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/reduce/reduce.h"

namespace chorus {
namespace {

using std::chrono::milliseconds;

// Sets environment variables for one test and restores them afterwards.
class ScopedEnv {
 public:
  ScopedEnv& set(const char* name, const char* value) {
    if (saved_.find(name) == saved_.end()) {
      const char* old = getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return *this;
  }
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

const char* kVars[] = {"CHORUS_TIMEOUT", "HCCL_EXEC_TIMEOUT", "CHORUS_CONNECT_TIMEOUT",
                       "HCCL_CONNECT_TIMEOUT", "CHORUS_ALGO", "CHORUS_IF_IP", "HCCL_IF_IP",
                       "CHORUS_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "MASTER_PORT", "RANK",
                       "WORLD_SIZE", "CHORUS_JOB_TOKEN", "CHORUS_SEGMENT_BYTES",
                       "CHORUS_SHM_CMA", "MASTER_ADDR", "CHORUS_STORE_ADDR",
                       "CHORUS_STORE_PORT", "CHORUS_LOG_LEVEL", "CHORUS_REDUCE_ISA",
                       "CHORUS_TRACE_BUFFER_SIZE", "CHORUS_RESTART_COUNT", "CHORUS_DEBUG"};

class SettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) env_.set(v, nullptr);
  }
  ScopedEnv env_;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

TEST_F(SettingsTest, DefaultsOfAnEmptyEnvironment) {
  EXPECT_EQ(settings::op_timeout(), std::chrono::minutes(30));
  EXPECT_EQ(settings::connect_timeout(), std::chrono::seconds(120));
  EXPECT_EQ(settings::master_port(), 29500);
  EXPECT_EQ(settings::master_addr(), "127.0.0.1");
  EXPECT_EQ(settings::rank(), 0);
  EXPECT_EQ(settings::world_size(), 1);
  EXPECT_EQ(settings::algorithm(), "auto");
  CommOptions o = CommOptions::from_env();
  EXPECT_EQ(o.algorithm, Algorithm::kAuto);
  EXPECT_EQ(o.job_token, "");
  EXPECT_EQ(o.listen_address, "");
}

// CHORUS_DEBUG=INFO or DETAIL makes info the default log level (as TORCH_DISTRIBUTED_DEBUG
// does); CHORUS_LOG_LEVEL, when set, still decides. Only DETAIL checks consistency.
TEST_F(SettingsTest, DebugInfoAndDetailRaiseTheDefaultLogLevel) {
  EXPECT_EQ(settings::debug_mode(), settings::DebugMode::kOff);
  EXPECT_EQ(settings::log_level(), 1);
  for (const char* info : {"INFO", "info", "Info"}) {
    env_.set("CHORUS_DEBUG", info);
    EXPECT_EQ(settings::debug_mode(), settings::DebugMode::kInfo) << info;
    EXPECT_EQ(settings::log_level(), 2) << info;
    EXPECT_FALSE(CommOptions::from_env().check_consistency) << info;
  }
  env_.set("CHORUS_DEBUG", "detail");
  EXPECT_EQ(settings::debug_mode(), settings::DebugMode::kDetail);
  EXPECT_EQ(settings::log_level(), 2);
  EXPECT_TRUE(CommOptions::from_env().check_consistency);
  env_.set("CHORUS_LOG_LEVEL", "error");
  EXPECT_EQ(settings::log_level(), 0);
  env_.set("CHORUS_DEBUG", "verbose");
  EXPECT_EQ(settings::log_level(), 0) << "CHORUS_LOG_LEVEL decides when it is set";
  const std::string msg = error_of([] { settings::debug_mode(); });
  EXPECT_NE(msg.find("CHORUS_DEBUG='VERBOSE' is not one of OFF, INFO, DETAIL"), std::string::npos) << msg;
  env_.set("CHORUS_LOG_LEVEL", nullptr);
  EXPECT_NE(error_of([] { settings::log_level(); }).find("CHORUS_DEBUG"), std::string::npos);
}

TEST_F(SettingsTest, DurationsAcceptSecondsAndSuffixes) {
  EXPECT_EQ(settings::parse_duration("X", "90", std::chrono::seconds(1)), milliseconds(90000));
  EXPECT_EQ(settings::parse_duration("X", "250ms", std::chrono::seconds(1)), milliseconds(250));
  EXPECT_EQ(settings::parse_duration("X", "1.5s", std::chrono::seconds(1)), milliseconds(1500));
  EXPECT_EQ(settings::parse_duration("X", "2m", std::chrono::seconds(1)), milliseconds(120000));
  EXPECT_EQ(settings::parse_duration("X", "1h", std::chrono::seconds(1)), milliseconds(3600000));
  for (const char* bad : {"", "abc", "-5", "0", "10parsecs", "5 s"}) {
    std::string msg = error_of([&] { settings::parse_duration("CHORUS_TIMEOUT", bad, std::chrono::seconds(1)); });
    EXPECT_NE(msg.find("CHORUS_TIMEOUT"), std::string::npos) << bad << ": " << msg;
  }
}

TEST_F(SettingsTest, ChorusNamesWinOverHcclFallbacks) {
  env_.set("HCCL_EXEC_TIMEOUT", "40").set("HCCL_CONNECT_TIMEOUT", "50");
  EXPECT_EQ(settings::op_timeout(), std::chrono::seconds(40));
  EXPECT_EQ(settings::connect_timeout(), std::chrono::seconds(50));
  env_.set("CHORUS_TIMEOUT", "5s").set("CHORUS_CONNECT_TIMEOUT", "6s");
  EXPECT_EQ(settings::op_timeout(), std::chrono::seconds(5));
  EXPECT_EQ(settings::connect_timeout(), std::chrono::seconds(6));
  env_.set("HCCL_IF_IP", "127.0.0.9");
  EXPECT_EQ(settings::if_ip(), "127.0.0.9");
  env_.set("CHORUS_IF_IP", "127.0.0.8");
  EXPECT_EQ(settings::if_ip(), "127.0.0.8");
  EXPECT_EQ(CommOptions::from_env().listen_address, "127.0.0.8");
}

// The timeout a front end passes (init_process_group's) applies unless the operator
// set CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT: that one then does, and one warning line
// says so where the two differ (issue 43).
TEST_F(SettingsTest, TimeoutVariablesOverrideAFrontEndsTimeout) {
  ASSERT_TRUE(log::enabled(log::kWarn)) << "CHORUS_LOG_LEVEL and CHORUS_DEBUG are unset";
  std::string logged;
  auto applied = [&](milliseconds asked) {
    testing::internal::CaptureStderr();
    const milliseconds timeout = CommOptions::from_env(asked).timeout;
    logged = testing::internal::GetCapturedStderr();
    return timeout;
  };
  EXPECT_FALSE(settings::op_timeout_override());
  EXPECT_EQ(applied(milliseconds(20000)), milliseconds(20000));
  EXPECT_EQ(logged, "");

  env_.set("HCCL_EXEC_TIMEOUT", "40");
  EXPECT_EQ(applied(milliseconds(20000)), milliseconds(40000));
  EXPECT_NE(logged.find("HCCL_EXEC_TIMEOUT=40 (40000 ms) applies to every operation, not "
                        "the timeout the program asked for (20000 ms)"),
            std::string::npos)
      << logged;

  env_.set("CHORUS_TIMEOUT", "5s");
  const auto set = settings::op_timeout_override();
  ASSERT_TRUE(set);
  EXPECT_EQ(set->variable, "CHORUS_TIMEOUT");
  EXPECT_EQ(set->value, "5s");
  EXPECT_EQ(set->timeout, milliseconds(5000));
  EXPECT_EQ(applied(milliseconds(20000)), milliseconds(5000));
  EXPECT_NE(logged.find("CHORUS_TIMEOUT=5s (5000 ms) applies"), std::string::npos) << logged;
  EXPECT_EQ(std::count(logged.begin(), logged.end(), '\n'), 1) << logged;
  EXPECT_EQ(applied(milliseconds(5000)), milliseconds(5000));
  EXPECT_EQ(logged, "") << "nothing to say when the two agree";
}

TEST_F(SettingsTest, BadValuesNameTheVariable) {
  env_.set("MASTER_PORT", "70000");
  EXPECT_NE(error_of([] { settings::master_port(); }).find("MASTER_PORT"), std::string::npos);
  env_.set("MASTER_PORT", "12ab");
  EXPECT_NE(error_of([] { settings::master_port(); }).find("MASTER_PORT"), std::string::npos);
  env_.set("CHORUS_ALGO", "bogus");
  EXPECT_NE(error_of([] { CommOptions::from_env(); }).find("CHORUS_ALGO"), std::string::npos);
  env_.set("CHORUS_ALGO", nullptr).set("HCCL_EXEC_TIMEOUT", "soon");
  EXPECT_NE(error_of([] { settings::op_timeout(); }).find("HCCL_EXEC_TIMEOUT"), std::string::npos);
}

// Issue 21: a value chorus cannot use is an error naming the variable, whether a
// communicator is about to be made (from_env) or the accessor is asked directly; none
// is logged and replaced by a default.
TEST_F(SettingsTest, EveryBadValueIsAnErrorNamingTheVariable) {
  env_.set("CHORUS_LOG_LEVEL", "foo");
  std::string msg = error_of([] { CommOptions::from_env(); });
  EXPECT_NE(msg.find("CHORUS_LOG_LEVEL='foo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("error, warn, info, debug"), std::string::npos) << msg;
  env_.set("CHORUS_LOG_LEVEL", "debug");
  EXPECT_EQ(error_of([] { CommOptions::from_env(); }), "<no ConfigError>");
  env_.set("CHORUS_LOG_LEVEL", nullptr);

  env_.set("CHORUS_REDUCE_ISA", "foo");
  msg = error_of([] { CommOptions::from_env(); });
  EXPECT_NE(msg.find("CHORUS_REDUCE_ISA='foo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("auto, portable, avx2, avx512"), std::string::npos) << msg;
  msg = error_of([] { parse_reduce_isa(settings::reduce_isa()); });
  EXPECT_NE(msg.find("CHORUS_REDUCE_ISA='foo'"), std::string::npos) << msg;
  for (const char* good : {"auto", "portable", "avx2", "avx512"}) {
    env_.set("CHORUS_REDUCE_ISA", good);
    EXPECT_EQ(settings::reduce_isa(), good);
    EXPECT_EQ(error_of([] { CommOptions::from_env(); }), "<no ConfigError>") << good;
  }
  env_.set("CHORUS_REDUCE_ISA", nullptr);

  // Set but empty: an address or a number that is not there. (Unset gives the default.)
  struct Empty {
    const char* name;
    std::function<void()> read;
  };
  const Empty empties[] = {
      {"MASTER_PORT", [] { settings::master_port(); }},
      {"MASTER_ADDR", [] { settings::master_addr(); }},
      {"CHORUS_STORE_PORT", [] { settings::store_port(); }},
      {"CHORUS_STORE_ADDR", [] { settings::store_addr(); }},
      {"WORLD_SIZE", [] { settings::world_size(); }},
      {"RANK", [] { settings::rank(); }},
      {"CHORUS_TIMEOUT", [] { settings::op_timeout(); }},
      {"CHORUS_CONNECT_TIMEOUT", [] { settings::connect_timeout(); }},
      {"CHORUS_SEGMENT_BYTES", [] { settings::segment_bytes(); }},
      {"CHORUS_TRACE_BUFFER_SIZE", [] { settings::trace_buffer_size(); }},
      {"CHORUS_RESTART_COUNT", [] { settings::restart_count(); }},
  };
  for (const Empty& e : empties) {
    ScopedEnv one;
    one.set(e.name, "");
    // RANK and WORLD_SIZE come together: the other one is set to a good value.
    if (std::string(e.name) == "RANK") one.set("WORLD_SIZE", "2");
    if (std::string(e.name) == "WORLD_SIZE") one.set("RANK", "0");
    msg = error_of(e.read);
    EXPECT_NE(msg.find(std::string(e.name) + " is set but empty"), std::string::npos)
        << e.name << ": " << msg;
  }
}

// A launcher's store (CHORUS_STORE_*) wins over MASTER_ADDR/MASTER_PORT, each of the
// two on its own; MASTER_* stay what a PyTorch program reads.
TEST_F(SettingsTest, StoreAddressFallsBackOnTheMasterAddress) {
  EXPECT_EQ(settings::store_addr(), "127.0.0.1");
  EXPECT_EQ(settings::store_port(), 29500);
  env_.set("MASTER_ADDR", "10.0.0.5").set("MASTER_PORT", "29555");
  EXPECT_EQ(settings::store_addr(), "10.0.0.5");
  EXPECT_EQ(settings::store_port(), 29555);
  env_.set("CHORUS_STORE_PORT", "31000");
  EXPECT_EQ(settings::store_addr(), "10.0.0.5");
  EXPECT_EQ(settings::store_port(), 31000);
  env_.set("CHORUS_STORE_ADDR", "10.0.0.6").set("CHORUS_STORE_PORT", nullptr);
  EXPECT_EQ(settings::store_addr(), "10.0.0.6");
  EXPECT_EQ(settings::store_port(), 29555);
  EXPECT_EQ(settings::master_port(), 29555);
  for (const char* bad : {"0", "65536", "http", "12ab", "-1"}) {
    env_.set("CHORUS_STORE_PORT", bad);
    std::string msg = error_of([] { settings::store_port(); });
    EXPECT_NE(msg.find("CHORUS_STORE_PORT"), std::string::npos) << bad << ": " << msg;
  }
}

TEST_F(SettingsTest, SegmentBytesTakeSuffixesAndABoundedRange) {
  EXPECT_EQ(settings::segment_bytes(), std::nullopt);
  EXPECT_EQ(CommOptions::from_env().segment_bytes, size_t{2} << 20);
  env_.set("CHORUS_SEGMENT_BYTES", "65536");
  EXPECT_EQ(settings::segment_bytes(), 65536);
  env_.set("CHORUS_SEGMENT_BYTES", "64K");
  EXPECT_EQ(CommOptions::from_env().segment_bytes, size_t{65536});
  env_.set("CHORUS_SEGMENT_BYTES", "3m");
  EXPECT_EQ(settings::segment_bytes(), int64_t{3} << 20);
  env_.set("CHORUS_SEGMENT_BYTES", "1G");
  EXPECT_EQ(settings::segment_bytes(), int64_t{1} << 30);
  for (const char* bad : {"4095", "2G", "K", "12KB", "-1M", "1.5M", "99999999999999999999"}) {
    env_.set("CHORUS_SEGMENT_BYTES", bad);
    std::string msg = error_of([] { settings::segment_bytes(); });
    EXPECT_NE(msg.find("CHORUS_SEGMENT_BYTES"), std::string::npos) << bad << ": " << msg;
  }
}

TEST_F(SettingsTest, CrossMemoryAttachIsOffOnForPairsOrOnForAll) {
  EXPECT_EQ(settings::shm_cma(), 1);
  env_.set("CHORUS_SHM_CMA", "0");
  EXPECT_EQ(settings::shm_cma(), 0);
  env_.set("CHORUS_SHM_CMA", "all");
  EXPECT_EQ(settings::shm_cma(), 2);
  env_.set("CHORUS_SHM_CMA", "2");
  EXPECT_NE(error_of([] { settings::shm_cma(); }).find("CHORUS_SHM_CMA"), std::string::npos);
}

TEST_F(SettingsTest, RankAndWorldSizeComeTogether) {
  env_.set("RANK", "1");
  std::string msg = error_of([] { settings::world_size(); });
  EXPECT_NE(msg.find("RANK"), std::string::npos);
  EXPECT_NE(msg.find("WORLD_SIZE"), std::string::npos);
  env_.set("WORLD_SIZE", "4");
  EXPECT_EQ(settings::rank(), 1);
  EXPECT_EQ(settings::world_size(), 4);
  env_.set("RANK", "4");
  EXPECT_NE(error_of([] { settings::rank(); }).find("RANK"), std::string::npos);
  env_.set("RANK", "0").set("WORLD_SIZE", "0");
  EXPECT_NE(error_of([] { settings::world_size(); }).find("WORLD_SIZE"), std::string::npos);
}

TEST_F(SettingsTest, InterfacePatterns) {
  // Loopback exists everywhere: "lo" as prefix, as exact name, and excluded.
  EXPECT_EQ(net::address_for_interfaces("lo", "CHORUS_SOCKET_IFNAME"), "127.0.0.1");
  EXPECT_EQ(net::address_for_interfaces("=lo", "CHORUS_SOCKET_IFNAME"), "127.0.0.1");
  EXPECT_EQ(net::address_for_interfaces("nosuchif,lo", "CHORUS_SOCKET_IFNAME"), "127.0.0.1");
  std::string msg = error_of([] { net::address_for_interfaces("=l", "CHORUS_SOCKET_IFNAME"); });
  EXPECT_NE(msg.find("CHORUS_SOCKET_IFNAME"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lo"), std::string::npos) << "lists the interfaces: " << msg;
  // Excluding loopback never picks a loopback address.
  try {
    std::string a = net::address_for_interfaces("^lo", "CHORUS_SOCKET_IFNAME");
    EXPECT_NE(a.rfind("127.", 0), 0u) << a;
    EXPECT_NE(a, "::1");
  } catch (const ConfigError&) {
    // A machine with only loopback: nothing left after the exclusion, also correct.
  }
  env_.set("HCCL_SOCKET_IFNAME", "=lo");
  EXPECT_EQ(CommOptions::from_env().listen_address, "127.0.0.1");
  env_.set("CHORUS_SOCKET_IFNAME", "=nosuchif0");
  msg = error_of([] { CommOptions::from_env(); });
  EXPECT_NE(msg.find("CHORUS_SOCKET_IFNAME"), std::string::npos) << msg;
}

TEST_F(SettingsTest, ListenAddressRoutesTowardsTheStore) {
  EXPECT_EQ(net::local_address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(net::local_address_towards("no-such-host.invalid"), "");
}

}  // namespace
}  // namespace chorus
