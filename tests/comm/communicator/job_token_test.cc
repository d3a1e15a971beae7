// The communicator's side of security (docs/security.md): ranks with different job
// tokens fail to connect, each naming CHORUS_JOB_TOKEN, without hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "chorus/chorus.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::contains;

TEST(SecurityCommunicator, DifferentTokensFailNamingTheVariable) {
  auto store = std::make_shared<InMemoryStore>();
  const auto start = Clock::now();
  auto errors = test::run_threads(2, [&](int rank) {
    CommOptions options = test::test_options();
    options.transport = TransportKind::kTcp;
    options.connect_timeout = 3s;
    options.job_token = rank == 0 ? "" : "a-token";  // one side without a token
    auto comm = Communicator::create(store, rank, 2, options);
    comm->abort("test: connected despite different job tokens");
  }, std::chrono::seconds(60));
  EXPECT_LT(Clock::now() - start, 20s) << "no hang: the connect timeout is 3 s";
  for (int rank = 0; rank < 2; ++rank) {
    std::string text = test::describe(errors[rank]);
    EXPECT_TRUE(contains(text, "CHORUS_JOB_TOKEN")) << "rank " << rank << ": " << text;
    EXPECT_TRUE(contains(text, "rank " + std::to_string(rank))) << text;
  }
  EXPECT_TRUE(contains(test::describe(errors[1]), "peer")) << test::describe(errors[1]);
}

}  // namespace
}  // namespace chorus
