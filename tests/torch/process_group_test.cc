// ProcessGroup::from_env(timeout), chorus_torch's init_process_group("env://", timeout):
// the timeout applies unless the operator set CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT,
// which then does, with one warning line where the two differ; as under torch_chorus
// (tests/torch_py, Timeouts) (issue 43).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "chorus/torch/process_group.h"
#include "util/ranks.h"
#include "util/security.h"

namespace chorus::torch_ext {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

// One-rank env:// groups on 127.0.0.1, with neither timeout variable set.
class FromEnvTimeout : public testing::Test {
 protected:
  void SetUp() override {
    env_.set("RANK", "0").set("WORLD_SIZE", "1").set("MASTER_ADDR", "127.0.0.1");
    for (const char* name : {"CHORUS_TIMEOUT", "HCCL_EXEC_TIMEOUT", "CHORUS_STORE_ADDR",
                             "CHORUS_STORE_PORT", "CHORUS_RESTART_COUNT", "CHORUS_LOG_LEVEL",
                             "CHORUS_DEBUG"}) {
      env_.set(name, nullptr);
    }
  }

  // The timeout that applies to a group made with `asked`; `logged_` is what its making
  // wrote on stderr. Each group's store takes a port of its own.
  milliseconds applied(milliseconds asked) {
    env_.set("MASTER_PORT", std::to_string(test::pick_free_port()).c_str());
    testing::internal::CaptureStderr();
    auto group = ProcessGroup::from_env(asked);
    logged_ = testing::internal::GetCapturedStderr();
    return group->communicator().options().timeout;
  }
  bool said(const std::string& text) const { return logged_.find(text) != std::string::npos; }

  test::ScopedEnv env_;
  std::string logged_;
};

TEST_F(FromEnvTimeout, TheProgramsTimeoutAppliesWhenNoVariableIsSet) {
  EXPECT_EQ(applied(20s), 20s);
  EXPECT_FALSE(said("applies")) << logged_;
}

TEST_F(FromEnvTimeout, ChorusTimeoutWinsAndSaysSo) {
  env_.set("CHORUS_TIMEOUT", "45");
  EXPECT_EQ(applied(20s), 45s);
  if (test::warnings_logged()) {
    EXPECT_TRUE(said("CHORUS_TIMEOUT=45 (45000 ms) applies to every operation, not the timeout "
                     "the program asked for (20000 ms)"))
        << logged_;
  }
  EXPECT_EQ(applied(45s), 45s);
  EXPECT_FALSE(said("applies")) << "nothing to say when the two agree: " << logged_;
}

TEST_F(FromEnvTimeout, HcclExecTimeoutIsTheFallback) {
  env_.set("HCCL_EXEC_TIMEOUT", "7");
  EXPECT_EQ(applied(20s), 7s);
  if (test::warnings_logged()) {
    EXPECT_TRUE(said("HCCL_EXEC_TIMEOUT=7 (7000 ms) applies")) << logged_;
  }
}

}  // namespace
}  // namespace chorus::torch_ext
