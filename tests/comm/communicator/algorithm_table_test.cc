// The table of algorithms (communicator/plan.h, algorithm_table.cc): every algorithm
// the public enum names has a name and at least one row, every row a body, and each
// collective's rows are what the plan can choose from. The enum is read from the
// header's source, so that a value added there without its rows fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/communicator.h"
#include "comm/communicator/plan.h"

namespace chorus::communicator {
namespace {

// The enumerators of `enum class Algorithm` in include/chorus/communicator.h, in order.
std::vector<std::string> enumerators_in_header() {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/include/chorus/communicator.h");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const size_t begin = s.find("enum class Algorithm");
  const size_t end = s.find("};", begin);
  EXPECT_NE(begin, std::string::npos) << "no enum class Algorithm in the header";
  std::vector<std::string> names;
  if (begin == std::string::npos || end == std::string::npos) return names;
  std::string body = s.substr(begin, end - begin);
  body = std::regex_replace(body, std::regex("//[^\n]*"), "");  // comments
  const std::regex enumerator(R"(\b(k[A-Z]\w*)\s*[,=])");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), enumerator); it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

TEST(AlgorithmTable, EveryAlgorithmTheEnumNamesHasANameAndRows) {
  const std::vector<std::string> enumerators = enumerators_in_header();
  ASSERT_GE(enumerators.size(), 7u) << "the header's enum was not read";
  std::set<std::string> names;
  for (size_t v = 0; v < enumerators.size(); ++v) {
    const Algorithm a = static_cast<Algorithm>(v);
    const std::string name = algorithm_name(a);
    EXPECT_NE(name, "?") << enumerators[v] << " has no name in the table";
    EXPECT_TRUE(names.insert(name).second) << "two algorithms are named " << name;
    ASSERT_TRUE(parse_algorithm(name).has_value()) << name;
    EXPECT_EQ(*parse_algorithm(name), a) << name;
    if (a == Algorithm::kAuto) continue;  // the choice itself, and the one tcp algorithm of some collectives
    size_t rows = 0;
    for (const AlgorithmEntry& e : algorithm_table()) rows += e.algorithm == a ? 1 : 0;
    EXPECT_GT(rows, 0u) << enumerators[v] << " (" << name << ") has no row in the algorithm table";
  }
  // One past the enum's last value is no algorithm.
  EXPECT_STREQ(algorithm_name(static_cast<Algorithm>(enumerators.size())), "?");
  EXPECT_FALSE(parse_algorithm("allreduce").has_value());
}

TEST(AlgorithmTable, EveryRowRunsAndNoCollectiveAlgorithmPairRepeats) {
  std::set<std::pair<int, int>> seen;
  for (const AlgorithmEntry& e : algorithm_table()) {
    const std::string what = std::string(collective_name(e.collective)) + "/" + algorithm_name(e.algorithm);
    EXPECT_NE(e.run, nullptr) << what;
    EXPECT_TRUE(seen.insert({static_cast<int>(e.collective), static_cast<int>(e.algorithm)}).second)
        << what << " has two rows";
    EXPECT_EQ(find_entry(e.collective, e.algorithm), &e) << what;
    // What runs at issue is shared memory's, on one node.
    if (e.at_issue != nullptr || e.run_shared != nullptr) {
      EXPECT_EQ(e.algorithm, Algorithm::kShmDirect) << what;
    }
    if (e.shared_at_issue != nullptr) {
      EXPECT_NE(e.run_shared, nullptr) << what;
    }
  }
}

// Every collective but send and recv (the transport routes them) has a row that runs
// anywhere: one over tcp, which the plan falls back to.
TEST(AlgorithmTable, EveryCollectiveHasAnAlgorithmOverTcp) {
  for (Collective c : kAllCollectives) {
    if (c == Collective::kSend || c == Collective::kRecv) {
      EXPECT_EQ(find_entry(c, Algorithm::kAuto), nullptr);
      continue;
    }
    bool tcp = false;
    for (const AlgorithmEntry& e : algorithm_table()) {
      tcp |= e.collective == c && e.algorithm != Algorithm::kShmDirect && e.algorithm != Algorithm::kHierarchical;
    }
    EXPECT_TRUE(tcp) << collective_name(c);
  }
}

}  // namespace
}  // namespace chorus::communicator
