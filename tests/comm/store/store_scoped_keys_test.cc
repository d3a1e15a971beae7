// Connection-scoped keys of the TCP store server (TcpStoreServerOptions::
// connection_scoped_prefix): a key under the prefix lasts as long as the connection
// that last wrote it, which is how chorusrun's node 0 learns at once that another
// node's launcher died (run/liveness.h).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "chorus/store.h"
#include "util/checks.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

struct ScopedServer {
  ScopedServer() {
    TcpStoreServerOptions options;
    options.job_token = "scoped";
    options.allowlist_file = "";
    options.connection_scoped_prefix = "job/alive/";
    server = std::make_unique<TcpStoreServer>("127.0.0.1", 0, options);
  }
  std::unique_ptr<TcpStore> client() const {
    return std::make_unique<TcpStore>("127.0.0.1", server->port(), 10s, "scoped");
  }
  std::unique_ptr<TcpStoreServer> server;
};

// Waits until the server has dropped every client but `n` (it handles a close in its
// own thread), so that a key that must stay is checked after the close was handled.
bool clients_down_to(const TcpStoreServer& server, int n) {
  return test::eventually([&] { return server.num_clients() <= n; });
}

TEST(StoreScopedKeys, AKeyUnderThePrefixGoesWithItsConnection) {
  ScopedServer s;
  auto observer = s.client();
  auto owner = s.client();
  owner->set("job/alive/1", "host-a");
  owner->set("job/other", "stays");
  owner->add("job/alive/counter", 3);
  ASSERT_TRUE(observer->check({"job/alive/1", "job/alive/counter", "job/other"}));
  owner.reset();  // closes the connection
  ASSERT_TRUE(clients_down_to(*s.server, 1));
  EXPECT_FALSE(observer->check({"job/alive/1"}));
  EXPECT_FALSE(observer->check({"job/alive/counter"}));
  EXPECT_TRUE(observer->check({"job/other"})) << "a key outside the prefix was deleted";
  EXPECT_EQ(observer->get_string("job/other"), "stays");
}

// The last writer owns the key: an earlier writer closing leaves it alone.
TEST(StoreScopedKeys, TheLastWriterOwnsTheKey) {
  ScopedServer s;
  auto observer = s.client();
  auto first = s.client();
  auto second = s.client();
  first->set("job/alive/0", "first");
  second->set("job/alive/0", "second");
  first->set("job/alive/9", "first");
  first.reset();
  ASSERT_TRUE(clients_down_to(*s.server, 2));
  EXPECT_FALSE(observer->check({"job/alive/9"}));
  EXPECT_TRUE(observer->check({"job/alive/0"}));
  EXPECT_EQ(observer->get_string("job/alive/0"), "second");
  second.reset();
  ASSERT_TRUE(clients_down_to(*s.server, 1));
  EXPECT_FALSE(observer->check({"job/alive/0"}));
}

// A deleted key, set again by someone else, belongs to that one; a WAIT parked on it
// is woken by the new key.
TEST(StoreScopedKeys, ADeletedKeyCanBeSetAgain) {
  ScopedServer s;
  auto observer = s.client();
  auto owner = s.client();
  owner->set("job/alive/2", "x");
  ASSERT_TRUE(owner->delete_key("job/alive/2"));
  observer->set("job/alive/2", "y");
  owner.reset();
  ASSERT_TRUE(clients_down_to(*s.server, 1));
  auto again = s.client();
  EXPECT_NO_THROW(again->wait({"job/alive/2"}, 5s));
  EXPECT_EQ(again->get_string("job/alive/2"), "y");
}

// Without a prefix nothing is scoped.
TEST(StoreScopedKeys, NoPrefixNoScopedKeys) {
  TcpStoreServerOptions options;
  options.job_token = "plain";
  options.allowlist_file = "";
  TcpStoreServer server("127.0.0.1", 0, options);
  auto owner = std::make_unique<TcpStore>("127.0.0.1", server.port(), 10s, "plain");
  owner->set("job/alive/1", "x");
  owner.reset();
  ASSERT_TRUE(clients_down_to(server, 0));
  TcpStore observer("127.0.0.1", server.port(), 10s, "plain");
  EXPECT_TRUE(observer.check({"job/alive/1"}));
}

}  // namespace
}  // namespace chorus
