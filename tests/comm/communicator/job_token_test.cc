// The communicator's side of security (docs/security.md): ranks with different job
// tokens fail to connect, each naming CHORUS_JOB_TOKEN, without hanging; the allow-list
// of CommOptions (read from the environment by from_env() alone) refuses other peers.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "chorus/chorus.h"
#include "util/checks.h"
#include "util/ranks.h"
#include "util/security.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::contains;
using test::SecurityAllowListEnv;

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

TEST_F(SecurityAllowListEnv, CommunicatorTakesTheAllowListFromItsOptions) {
  test::TempFile file("comm.allow", "127.0.0.2\n");
  env_.set("CHORUS_WHITELIST_FILE", file.path().c_str());
  const CommOptions from_env = test::test_options();  // CommOptions::from_env() underneath
  EXPECT_EQ(from_env.allowlist_file, file.path());
  EXPECT_EQ(from_env.allowlist_source, "CHORUS_WHITELIST_FILE");
  auto connect = [&](bool with_list) {
    auto store = std::make_shared<InMemoryStore>();
    return test::run_threads(2, [&](int rank) {
      CommOptions options = from_env;
      options.transport = TransportKind::kTcp;
      options.connect_timeout = 3s;
      options.listen_address = "127.0.0.1";
      if (!with_list) options.allowlist_file.clear();
      auto comm = Communicator::create(store, rank, 2, options);
      comm->barrier().wait();
    }, std::chrono::seconds(60));
  };
  // The file names 127.0.0.2 only: the ranks on 127.0.0.1 refuse each other, naming it.
  auto refused = connect(true);
  std::string all = test::describe(refused[0]) + " | " + test::describe(refused[1]);
  EXPECT_TRUE(contains(all, "is not in the allow-list " + file.path() + " (CHORUS_WHITELIST_FILE)"))
      << all;
  // The variable is still set, but the options say every address: the communicator
  // reads its options, not the environment.
  auto connected = connect(false);
  EXPECT_FALSE(connected[0]) << test::describe(connected[0]);
  EXPECT_FALSE(connected[1]) << test::describe(connected[1]);
  // A file that cannot be read fails create() naming it and what set it.
  CommOptions missing = from_env;
  missing.allowlist_file = "/nonexistent/comm.allow";
  missing.allowlist_source = "the test";
  try {
    Communicator::create(std::make_shared<InMemoryStore>(), 0, 1, missing);
    ADD_FAILURE() << "an unreadable allow-list was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "/nonexistent/comm.allow (the test)")) << e.what();
  }
}

}  // namespace
}  // namespace chorus
