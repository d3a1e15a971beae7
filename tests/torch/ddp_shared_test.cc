// DistributedDataParallel's buckets in node-shared memory (ddp.h): where they are (in
// shared memory exactly where the direct path is possible, ordinary memory with
// CHORUS_SHM_DIRECT=0, over tcp and with one rank per node), and that training on them
// gives the same parameters, bit for bit, as training on ordinary buckets, with and
// without gradient_as_bucket_view, with uneven inputs (a joined rank's zero buckets
// must be shared too) and with a compressing hook, over several world sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/torch/ddp.h"
#include "util/ranks.h"

namespace chorus::torch_ext {
namespace {

// Large enough for several buckets under the caps below (8.5 KiB, 66 KiB, 4 KiB and
// 1 KiB of gradients), small enough that a step is quick on four rank threads.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 256));
    fc3 = register_module("fc3", torch::nn::Linear(256, 4));
    norm = register_module("norm", torch::nn::BatchNorm1d(64));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(norm(fc1(x)));
    return fc3(torch::relu(fc2(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Net);

// Different weights on every rank (construction broadcasts rank 0's) and per-rank data,
// from private generators: ranks are threads.
Net seeded_net(uint64_t seed) {
  Net net;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.1);
  return net;
}

torch::Tensor batch_for(int rank, int step) {
  at::Generator gen = at::detail::createCPUGenerator(7919 * step + rank);
  return torch::randn({16, 32}, gen);
}

DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_mb = 0.004;
  o.bucket_cap_mb = 0.06;
  return o;
}

// Where the ranks run: rank r of `size` with `options`, on node node_of(r).
struct Layout {
  int size = 2;
  CommOptions options = test::test_options();
  std::function<std::string(int)> node_of = [](int) { return std::string(); };  // the real one
};

// Runs body(rank, group) on rank threads with per-rank node identities.
void on_ranks(const Layout& layout, const std::function<void(int, std::shared_ptr<ProcessGroup>)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  auto errors = test::run_threads(layout.size, [&](int rank) {
    CommOptions o = layout.options;
    o.node_id = layout.node_of(rank);
    body(rank, std::make_shared<ProcessGroup>(Communicator::create(store, rank, layout.size, o)));
  });
  test::rethrow_rank_failures(errors);
}

bool in_shared_memory(const at::Tensor& t) {
  return chorus::in_shared_memory(t.data_ptr(), t.numel() * t.element_size());
}

struct Trained {
  // Per rank, after training: the parameters, then the buffers (batch-norm statistics,
  // which differ between ranks: each rank's forward updates them from its own batch).
  std::vector<std::vector<torch::Tensor>> params;
  size_t parameters = 0;
  std::vector<int> shared;   // per rank: buckets_in_shared_memory()
  std::vector<int> grads_shared;  // per rank: every .grad lies in node-shared memory
};

struct Training {
  int steps = 4;
  bool view = false;
  Compression compression = Compression::kNone;
  std::vector<int> batches = {};  // per rank, under uneven_inputs(); empty: `steps` each
};

Trained train(const Layout& layout, const Training& t) {
  Trained out;
  out.params.resize(layout.size);
  out.shared.assign(layout.size, -1);
  out.grads_shared.assign(layout.size, -1);
  on_ranks(layout, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Net net = seeded_net(rank);
    DdpOptions o = small_buckets();
    o.gradient_as_bucket_view = t.view;
    o.compression = t.compression;
    DistributedDataParallel ddp(net.ptr(), group, o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto step = [&](int s) {
      opt.zero_grad();
      ddp.forward(net, batch_for(rank, s)).pow(2).mean().backward();
      opt.step();
    };
    if (t.batches.empty()) {
      for (int s = 0; s < t.steps; ++s) step(s);
    } else {
      auto guard = ddp.uneven_inputs();
      for (int s = 0; s < t.batches[rank]; ++s) step(s);
      ddp.join();
    }
    out.shared[rank] = ddp.buckets_in_shared_memory();
    bool all = true;
    for (const auto& p : net->parameters()) all = all && p.grad().defined() && in_shared_memory(p.grad());
    out.grads_shared[rank] = all;
    for (const auto& p : net->parameters()) out.params[rank].push_back(p.detach().clone());
    if (rank == 0) out.parameters = out.params[0].size();
    for (const auto& b : net->buffers()) out.params[rank].push_back(b.clone());
  });
  return out;
}

void expect_identical(const Trained& a, const Trained& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t r = 0; r < a.params.size(); ++r) {
    ASSERT_EQ(a.params[r].size(), b.params[r].size());
    for (size_t k = 0; k < a.params[r].size(); ++k) {
      EXPECT_TRUE(torch::equal(a.params[r][k], b.params[r][k])) << "rank " << r << " tensor " << k;
      if (k < a.parameters) {
        EXPECT_TRUE(torch::equal(a.params[0][k], b.params[r][k])) << "rank " << r << " parameter " << k
                                                                   << " differs from rank 0's";
      }
    }
  }
}

Layout ordinary(Layout s) {
  s.options.shm_direct = false;
  return s;
}

TEST(DdpSharedBuckets, InSharedMemoryExactlyWhereTheDirectPathIsPossible) {
  Training view{.steps = 2, .view = true};  // .grad are views into the buckets
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Layout one_node{.size = size};
    Trained t = train(one_node, view);
    EXPECT_EQ(t.shared, std::vector<int>(size, 1));
    EXPECT_EQ(t.grads_shared, std::vector<int>(size, 1));
    struct Case {
      const char* what;
      Layout layout;
    };
    Layout tcp{.size = size};
    tcp.options.transport = TransportKind::kTcp;
    Layout apart{.size = size, .node_of = [](int r) { return "node" + std::to_string(r); }};
    Layout two_nodes{.size = 2 * size, .node_of = [size](int r) { return "node" + std::to_string(r / size); }};
    for (const Case& c : {Case{"CHORUS_SHM_DIRECT=0", ordinary(one_node)}, Case{"tcp", tcp},
                          Case{"one rank per node", apart}, Case{"two nodes", two_nodes}}) {
      SCOPED_TRACE(c.what);
      Trained o = train(c.layout, view);
      EXPECT_EQ(o.shared, std::vector<int>(c.layout.size, 0));
      EXPECT_EQ(o.grads_shared, std::vector<int>(c.layout.size, 0));
    }
  }
}

TEST(DdpSharedBuckets, OneRankKeepsOrdinaryMemory) {
  Trained t = train(Layout{.size = 1}, Training{.steps = 2, .view = true});
  EXPECT_EQ(t.shared, std::vector<int>{0});
}

TEST(DdpSharedBuckets, TrainingMatchesOrdinaryBucketsBitwise) {
  for (int size : {2, 3, 4}) {
    for (bool view : {false, true}) {
      SCOPED_TRACE("size " + std::to_string(size) + (view ? ", gradient_as_bucket_view" : ""));
      Training t{.steps = 4, .view = view};
      Trained shared = train(Layout{.size = size}, t);
      ASSERT_EQ(shared.shared, std::vector<int>(size, 1));
      expect_identical(train(ordinary(Layout{.size = size}), t), shared);
    }
  }
}

// A joined rank shadows the allreduces on zero buckets, which must be the same kind of
// memory as the training ranks' buckets (PeerError otherwise).
TEST(DdpSharedBuckets, UnevenInputsMatchOrdinaryBuckets) {
  for (const std::vector<int>& batches : {std::vector<int>{3, 1}, std::vector<int>{2, 4, 0}}) {
    const int size = static_cast<int>(batches.size());
    SCOPED_TRACE("ranks " + std::to_string(size));
    Training t{.view = true, .batches = batches};
    expect_identical(train(ordinary(Layout{.size = size}), t), train(Layout{.size = size}, t));
  }
}

// The compressing hooks allreduce a float16 copy (ordinary memory on every rank).
TEST(DdpSharedBuckets, CompressedBucketsMatchOrdinaryBuckets) {
  Training t{.steps = 3, .compression = Compression::kFloat16};
  expect_identical(train(ordinary(Layout{.size = 3}), t), train(Layout{.size = 3}, t));
}

}  // namespace
}  // namespace chorus::torch_ext
