// ProcessGroup::from_env(timeout), chorus_torch's init_process_group("env://", timeout):
// the timeout applies unless the operator set CHORUS_TIMEOUT, else HCCL_EXEC_TIMEOUT,
// which then does, with one warning line where the two differ; as under torch_chorus
// (tests/torch_py, Timeouts) (issue 43).
//
// ProcessGroup::alltoall (torch's all_to_all_single) with ranks as threads: 1 to 5
// ranks, every dtype, equal, uneven and zero split sizes against closed-form blocks;
// its argument errors; split sizes that disagree between ranks, which fail on every
// rank naming both sides and leave the group usable; and dtypes that disagree, which
// fail on every rank naming both calls (issue 44).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "chorus/torch/process_group.h"
#include "util/checks.h"
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

// ---- alltoall

using test::contains;
using test::error_of;

// The dtypes chorus_torch moves.
const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                             at::kChar,  at::kByte,   at::kInt,  at::kLong};

// How the rows a rank sends are split: dim 0 / size each (no split sizes passed), an
// uneven number per pair of ranks with zeros among them, or none at all.
enum class Splits { kEqual, kUneven, kZero };

constexpr int64_t kEqualRows = 2;  // rows per pair of ranks under Splits::kEqual
constexpr int64_t kColumns = 3;

// Rows rank `from` sends rank `to`.
int64_t rows_between(Splits splits, int from, int to) {
  switch (splits) {
    case Splits::kEqual: return kEqualRows;
    case Splits::kUneven: return (from + 2 * to) % 4;  // 0 for some pairs, 3 for others
    case Splits::kZero: return 0;
  }
  return 0;
}

// Row `row`, column `column` of what rank `from` sends rank `to`: small integers, exact in
// every dtype above (int8 included).
double cell(int from, int to, int64_t row, int64_t column) {
  return static_cast<double>((from * 31 + to * 17 + row * 5 + column) % 100);
}

// The blocks of rank `self`: what it sends (`sending`, blocks for rank 0, 1, ...) or
// what it must receive (blocks from rank 0, 1, ...), [rows, kColumns] of `dtype`.
at::Tensor blocks(Splits splits, int self, int size, bool sending, at::ScalarType dtype) {
  std::vector<double> values;
  for (int peer = 0; peer < size; ++peer) {
    const int from = sending ? self : peer, to = sending ? peer : self;
    for (int64_t k = 0; k < rows_between(splits, from, to); ++k) {
      for (int64_t c = 0; c < kColumns; ++c) values.push_back(cell(from, to, k, c));
    }
  }
  const auto rows = static_cast<int64_t>(values.size()) / kColumns;
  return torch::tensor(values, torch::kDouble).view({rows, kColumns}).to(dtype);
}

// The split sizes of rank `self` (empty under Splits::kEqual, as torch's default).
std::vector<int64_t> split_sizes(Splits splits, int self, int size, bool sending) {
  std::vector<int64_t> rows;
  if (splits == Splits::kEqual) return rows;
  for (int peer = 0; peer < size; ++peer) {
    rows.push_back(sending ? rows_between(splits, self, peer) : rows_between(splits, peer, self));
  }
  return rows;
}

// Runs body(group, rank) on `size` ranks as threads, each over a ProcessGroup of a
// communicator the test harness owns.
void on_ranks(int size, const std::function<void(ProcessGroup&, int)>& body,
              CommOptions options = test::test_options()) {
  test::run_ranks(
      size,
      [&](Communicator& c) {
        ProcessGroup group(std::shared_ptr<Communicator>(std::shared_ptr<Communicator>(), &c));
        body(group, c.rank());
      },
      options);
}

class Alltoall : public testing::TestWithParam<int> {};

TEST_P(Alltoall, EveryDtypeWithEqualUnevenAndZeroSplits) {
  const int size = GetParam();
  on_ranks(size, [&](ProcessGroup& group, int me) {
    for (Splits splits : {Splits::kEqual, Splits::kUneven, Splits::kZero}) {
      for (at::ScalarType dtype : kDtypes) {
        const at::Tensor input = blocks(splits, me, size, true, dtype);
        const at::Tensor expected = blocks(splits, me, size, false, dtype);
        at::Tensor output = torch::full_like(expected, 7);
        group
            .alltoall(output, input, split_sizes(splits, me, size, false),
                      split_sizes(splits, me, size, true))
            .wait();
        EXPECT_TRUE(torch::equal(output, expected))
            << "rank " << me << " of " << size << ", " << c10::toString(dtype) << ", splits "
            << static_cast<int>(splits) << ": got\n"
            << output << "\nexpected\n"
            << expected;
      }
    }
  });
}

// Rows of several dimensions, and no split sizes: dim 0 cut into equal blocks.
TEST_P(Alltoall, RowsOfSeveralDimensionsInEqualBlocks) {
  const int size = GetParam();
  on_ranks(size, [&](ProcessGroup& group, int me) {
    // Rank r's input: element e of the block for rank j is 1000 r + 100 j + e.
    auto block = [](int from, int to) {
      return torch::arange(12, torch::kLong).view({2, 2, 3}) + 1000 * from + 100 * to;
    };
    std::vector<at::Tensor> sent, received;
    for (int peer = 0; peer < size; ++peer) {
      sent.push_back(block(me, peer));
      received.push_back(block(peer, me));
    }
    at::Tensor input = torch::cat(sent), output = torch::empty_like(input);
    group.alltoall(output, input).wait();
    EXPECT_TRUE(torch::equal(output, torch::cat(received))) << "rank " << me << ": " << output;
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, Alltoall, testing::Range(1, 6),
                         [](const testing::TestParamInfo<int>& info) {
                           return "size" + std::to_string(info.param);
                         });

// Every argument error names alltoall and what was wrong, is thrown before anything is
// sent (the next call on the group works), and is the same on every rank.
TEST(AlltoallArguments, AreRefusedNamingTheArgument) {
  on_ranks(3, [&](ProcessGroup& group, int me) {
    const at::Tensor in = torch::zeros({6, 2}), out = torch::zeros({6, 2});
    auto refusal = [&](const at::Tensor& o, const at::Tensor& i, std::vector<int64_t> os,
                       std::vector<int64_t> is) {
      return error_of<InvalidArgumentError>([&] { group.alltoall(o, i, os, is); });
    };
    std::string what = refusal(out, in, {}, {1, 2});
    EXPECT_TRUE(contains(what, "alltoall: input_split_sizes has 2 entries; expected one per rank (3)"))
        << what;
    what = refusal(out, in, {2, 2, 3}, {});
    EXPECT_TRUE(contains(what, "alltoall: output_split_sizes add up to 7 rows, but output [6, 2] has 6"))
        << what;
    what = refusal(out, in, {}, {4, -1, 3});
    EXPECT_TRUE(contains(what, "alltoall: input_split_sizes[1] is -1; a split size cannot be negative"))
        << what;
    what = refusal(torch::zeros({4, 2}), in, {}, {});
    EXPECT_TRUE(contains(what, "alltoall: output [4, 2] has 4 rows, which do not split evenly over 3 ranks; "
                               "pass output_split_sizes")) << what;
    what = refusal(out, in.to(torch::kDouble), {}, {});
    EXPECT_TRUE(contains(what, "alltoall: output has dtype Float but input Double")) << what;
    what = refusal(out, torch::zeros({2, 6}).t(), {}, {});
    EXPECT_TRUE(contains(what, "alltoall: input [6, 2] is not contiguous")) << what;
    what = refusal(out.to(torch::kBool), in.to(torch::kBool), {}, {});
    EXPECT_TRUE(contains(what, "alltoall: input has dtype Bool")) << what;
    what = refusal(torch::zeros({}), torch::zeros({}), {}, {});
    EXPECT_TRUE(contains(what, "alltoall: input [] and output [] must have at least one dimension")) << what;
    what = refusal(in, in, {}, {});
    EXPECT_TRUE(contains(what, "alltoall: input [6, 2] and output [6, 2] share memory")) << what;
    what = refusal(in.narrow(0, 0, 3), in.narrow(0, 2, 3), {1, 1, 1}, {1, 1, 1});
    EXPECT_TRUE(contains(what, "share memory")) << what;
    // Nothing was sent: the group still exchanges.
    at::Tensor mine = torch::full({3, 2}, static_cast<float>(me)), got = torch::empty({3, 2});
    group.alltoall(got, mine).wait();
    EXPECT_TRUE(torch::equal(got, torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f}).view({3, 2}))) << got;
  });
}

// Split sizes that disagree between ranks: rank 1 expects 3 rows from rank 0, which
// sends it 2 (each rank's own sizes add up). Every rank's Work fails with the
// communicator's message naming both sides in elements (rows of 2), and the group is
// still usable: the same exchange with agreeing sizes then works. Over shared memory
// and over tcp, where the ranks compare their counts differently.
void expect_disagreement_fails_everywhere(int size, TransportKind transport) {
  CommOptions options = test::test_options();
  options.transport = transport;
  auto body = [&](ProcessGroup& group, int me) {
    // Agreed: 2 rows from every rank to every rank.
    std::vector<int64_t> send(size, 2), recv(size, 2);
    if (me == 1) {  // expects 3 rows from rank 0 and 1 from rank 1 (still 2 * size in all)
      recv[0] = 3;
      recv[1] = 1;
    }
    at::Tensor input = torch::full({2 * size, 2}, static_cast<float>(me));
    at::Tensor output = torch::zeros({2 * size, 2});
    std::string what =
        error_of<InvalidArgumentError>([&] { group.alltoall(output, input, recv, send).wait(); });
    EXPECT_TRUE(contains(what, "alltoallv on rank " + std::to_string(me) +
                                   ": counts disagree between ranks (rank 0 sends 4 elements to "
                                   "rank 1, which expects 6"))
        << "rank " << me << ": " << what;
    group.alltoall(output, input, send, send).wait();
    for (int from = 0; from < size; ++from) {
      EXPECT_TRUE(torch::equal(output.narrow(0, 2 * from, 2), torch::full({2, 2}, static_cast<float>(from))))
          << "rank " << me << ": " << output;
    }
  };
  on_ranks(size, body, options);
}

// Ranks that pass tensors of other dtypes (the same counts): a disagreement of the
// calls, which the communicator reports as any other: PeerError on every rank, naming both
// calls; the communicator is then broken (its contract for mismatched calls).
void expect_dtype_disagreement_fails_everywhere(TransportKind transport) {
  CommOptions options = test::test_options();
  options.transport = transport;
  on_ranks(
      3,
      [&](ProcessGroup& group, int me) {
        const auto dtype = me == 2 ? torch::kDouble : torch::kFloat;
        at::Tensor input = torch::ones({6, 2}, dtype), output = torch::zeros({6, 2}, dtype);
        std::string what;
        try {
          group.alltoall(output, input).wait();
          ADD_FAILURE() << "rank " << me << ": the alltoall completed";
        } catch (const PeerError& e) {
          what = e.what();
        }
        EXPECT_TRUE(contains(what, "mismatch")) << "rank " << me << ": " << what;
        EXPECT_TRUE(contains(what, "f64") && contains(what, "f32")) << "rank " << me << ": " << what;
      },
      options);
}

TEST(AlltoallDisagreement, OfDtypesFailsOnEveryRankOverSharedMemory) {
  expect_dtype_disagreement_fails_everywhere(TransportKind::kAuto);
}

TEST(AlltoallDisagreement, OfDtypesFailsOnEveryRankOverTcp) {
  expect_dtype_disagreement_fails_everywhere(TransportKind::kTcp);
}

TEST(AlltoallDisagreement, FailsOnEveryRankNamingBothSidesOverSharedMemory) {
  for (int size : {2, 3}) expect_disagreement_fails_everywhere(size, TransportKind::kAuto);
}

TEST(AlltoallDisagreement, FailsOnEveryRankNamingBothSidesOverTcp) {
  for (int size : {2, 3}) expect_disagreement_fails_everywhere(size, TransportKind::kTcp);
}

}  // namespace
}  // namespace chorus::torch_ext
