// DistributedDataParallel with ranks as threads: replicas start equal, gradients are
// the average over ranks, parameters stay bitwise identical, no_sync accumulates,
// unused parameters, compression, bucket layout, communication hooks, uneven inputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <thread>

#include "chorus/chorus.h"
#include "chorus/torch/ddp.h"
#include "util/checks.h"
#include "util/ranks.h"

namespace chorus::torch_ext {
namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 4));
    side = register_module("side", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_side = false) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    x = fc3(x);
    return use_side ? side(x) : x;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, side{nullptr};
};
TORCH_MODULE(Mlp);

// Per-rank data from a private generator: ranks are threads, and the global generator
// would interleave their draws.
torch::Tensor batch_for(int rank, int step, int64_t n = 8) {
  at::Generator gen = at::detail::createCPUGenerator(1000 * step + rank);
  return torch::randn({n, 16}, gen);
}

// A model whose weights come from a private generator seeded with `seed`.
Mlp seeded_mlp(uint64_t seed) {
  Mlp model;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.2);
  return model;
}

// Runs body(rank, group) on `size` ranks as threads.
void on_ranks(int size, const std::function<void(int, std::shared_ptr<ProcessGroup>)>& body) {
  test::run_ranks(size, [&](Communicator& c) {
    // The test harness owns the communicator; wrap it without taking ownership.
    std::shared_ptr<Communicator> alias(std::shared_ptr<Communicator>(), &c);
    body(c.rank(), std::make_shared<ProcessGroup>(alias));
  });
}

std::vector<torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(Ddp, ReplicasStartEqualAndStayBitwiseEqual) {
  const int size = 3;
  std::vector<std::vector<torch::Tensor>> final(size);
  on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(rank);  // different initial weights on every rank
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      auto loss = ddp.forward(model, batch_for(rank, step)).pow(2).mean();
      loss.backward();
      opt.step();
    }
    final[rank] = snapshot(*model);
  });
  for (int r = 1; r < size; ++r) {
    for (size_t k = 0; k < final[0].size(); ++k) {
      EXPECT_TRUE(torch::equal(final[0][k], final[r][k])) << "rank " << r << " parameter " << k;
    }
  }
}

// gradient_as_bucket_view: libtorch's Optimizer::zero_grad() detaches and zeroes every
// .grad in place, which must work on the bucket-backed gradients; training must match
// the copying mode bit for bit; and from the second step on the gradients stay in the
// buckets (the same storage every step, no copies).
TEST(Ddp, GradientAsBucketViewWorksWithTheOptimizerAndMatchesCopies) {
  const int size = 3;
  std::vector<std::vector<torch::Tensor>> final[2];
  for (int view = 0; view < 2; ++view) {
    final[view].resize(size);
    on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      Mlp model = seeded_mlp(rank);
      DdpOptions o;
      o.find_unused_parameters = true;
      o.gradient_as_bucket_view = view == 1;
      DistributedDataParallel ddp(model.ptr(), group, o);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      std::vector<const void*> storage;
      for (int step = 0; step < 5; ++step) {
        opt.zero_grad();
        auto loss = ddp.forward(model, batch_for(rank, step)).pow(2).mean();
        loss.backward();
        opt.step();
        if (view == 1) {
          std::vector<const void*> now;
          for (auto& p : model->parameters()) now.push_back(p.grad().data_ptr());
          if (step > 0) {
            EXPECT_EQ(now, storage) << "step " << step << ": a gradient left its bucket";
          }
          storage = now;
        }
      }
      final[view][rank] = snapshot(*model);
    });
  }
  for (int r = 0; r < size; ++r) {
    for (size_t k = 0; k < final[0][0].size(); ++k) {
      EXPECT_TRUE(torch::equal(final[0][0][k], final[1][r][k])) << "rank " << r << " parameter " << k;
    }
  }
}

// One rank: the average is the gradient itself, so DDP must train exactly like the
// model without it; an unused parameter still gets a zero gradient, or the error.
TEST(Ddp, OneRankTrainsExactlyLikeThePlainModel) {
  auto train = [](Mlp model, DistributedDataParallel* ddp) {
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      torch::Tensor out = ddp ? ddp->forward(model, batch_for(0, step)) : model->forward(batch_for(0, step));
      out.pow(2).mean().backward();
      opt.step();
    }
    return snapshot(*model);
  };
  Mlp plain = seeded_mlp(3);
  std::vector<torch::Tensor> expected = train(plain, nullptr), got;
  on_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(3);
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    got = train(model, &ddp);
    EXPECT_TRUE(torch::equal(model->side->weight.grad(), torch::zeros_like(model->side->weight)));
  });
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(torch::equal(got[k], expected[k])) << "parameter " << k;
  on_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(3);
    DistributedDataParallel ddp(model.ptr(), group);
    std::string what = test::error_of<InvalidArgumentError>([&] { ddp.forward(model, batch_for(0, 0)).sum().backward(); });
    EXPECT_NE(what.find("side.weight"), std::string::npos) << what;
  });
}

TEST(Ddp, GradientsAreTheAverageOverRanks) {
  const int size = 2;
  // The reference: per-rank gradients computed without DDP from the same weights.
  Mlp reference = seeded_mlp(7);
  std::vector<std::vector<torch::Tensor>> per_rank(size), synced(size);
  for (int r = 0; r < size; ++r) {
    reference->zero_grad();
    reference->forward(batch_for(r, 0)).pow(2).mean().backward();
    for (auto& p : reference->parameters()) {
      per_rank[r].push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    }
  }
  on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model;
    {
      torch::NoGradGuard g;
      auto src = reference->parameters();
      auto dst = model->parameters();
      for (size_t k = 0; k < src.size(); ++k) dst[k].copy_(src[k]);
    }
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
    for (auto& p : model->parameters()) synced[rank].push_back(p.grad().clone());
  });
  for (size_t k = 0; k < per_rank[0].size(); ++k) {
    torch::Tensor expected = (per_rank[0][k] + per_rank[1][k]) / 2;
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(torch::allclose(synced[r][k], expected, 1e-5, 1e-6)) << "parameter " << k;
    }
  }
}

TEST(Ddp, NoSyncAccumulatesThenAveragesTheSum) {
  const int size = 2;
  std::vector<std::vector<torch::Tensor>> grads(size), local(size);
  on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(3);
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    {
      auto guard = ddp.no_sync();
      ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
      for (auto& p : model->parameters()) {
        if (p.grad().defined()) local[rank].push_back(p.grad().clone());
      }
    }
    ddp.forward(model, batch_for(rank, 1)).pow(2).mean().backward();
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) grads[rank].push_back(p.grad().clone());
    }
  });
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t k = 0; k < grads[0].size(); ++k) {
    EXPECT_TRUE(torch::equal(grads[0][k], grads[1][k])) << k;
  }
  // After the no_sync step the ranks' local gradients differ (different data).
  EXPECT_FALSE(torch::equal(local[0][0], local[1][0]));
}

TEST(Ddp, UnusedParametersFailUnlessAllowed) {
  std::vector<std::string> errors(2);
  try {
    on_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
      Mlp model;
      DistributedDataParallel ddp(model.ptr(), group);
      try {
        ddp.forward(model, batch_for(rank, 0)).sum().backward();  // "side" unused
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  } catch (const test::RankFailure&) {
  }
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("side.weight"), std::string::npos) << errors[r];

  std::vector<torch::Tensor> side_grads(2);
  on_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model;
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    // Rank 1 uses the side layer, rank 0 does not: its gradient counts as zero.
    ddp.forward(model, batch_for(rank, 0), rank == 1).sum().backward();
    side_grads[rank] = model->side->weight.grad().clone();
  });
  EXPECT_TRUE(torch::equal(side_grads[0], side_grads[1]));
  EXPECT_GT(side_grads[0].abs().sum().item<float>(), 0.0f);
}

TEST(Ddp, CompressedGradientsAreClose) {
  for (Compression c : {Compression::kFloat16, Compression::kBFloat16}) {
    std::vector<std::vector<torch::Tensor>> exact(2), packed(2);
    for (Compression mode : {Compression::kNone, c}) {
      on_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
        Mlp model = seeded_mlp(11);
        DdpOptions o;
        o.compression = mode;
        o.find_unused_parameters = true;
        DistributedDataParallel ddp(model.ptr(), group, o);
        ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
        auto& out = mode == Compression::kNone ? exact[rank] : packed[rank];
        for (auto& p : model->parameters()) out.push_back(p.grad().clone());
      });
    }
    double tol = c == Compression::kFloat16 ? 2e-3 : 2e-2;
    for (size_t k = 0; k < exact[0].size(); ++k) {
      EXPECT_TRUE(torch::allclose(packed[0][k], exact[0][k], tol, 1e-3)) << k;
      EXPECT_TRUE(torch::equal(packed[0][k], packed[1][k])) << k;
    }
  }
}

TEST(Ddp, BucketsFollowReverseRegistrationOrderAndCaps) {
  on_ranks(1, [&](int, std::shared_ptr<ProcessGroup> group) {
    Mlp model;
    DdpOptions o;
    o.first_bucket_mb = 0;       // the first bucket closes after one parameter
    o.bucket_cap_mb = 4.5 / 1024;  // 4.5 KiB: fc2.weight (4 KiB) fills a bucket
    DistributedDataParallel ddp(model.ptr(), group, o);
    auto layout = ddp.bucket_layout();
    // Parameters: 0 fc1.w 1 fc1.b 2 fc2.w 3 fc2.b 4 fc3.w 5 fc3.b 6 side.w 7 side.b
    ASSERT_GE(layout.size(), 3u);
    EXPECT_EQ(layout[0], std::vector<size_t>({7}));
    std::vector<size_t> order;
    for (auto& b : layout) order.insert(order.end(), b.begin(), b.end());
    EXPECT_EQ(order, std::vector<size_t>({7, 6, 5, 4, 3, 2, 1, 0}));
  });
}

// last_step_stats: synchronized backward passes are counted with their buckets, a
// wait that is part of the backward, and no_sync passes are not counted. (No test
// asserts on how long anything took.)
TEST(Ddp, LastStepStatsCountSynchronizedBackwardsAndTheirBuckets) {
  const int size = 2;
  std::vector<std::vector<DdpStats>> seen(size);
  std::vector<size_t> buckets(size);
  on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(4);
    DdpOptions o;
    o.first_bucket_mb = 0;  // several buckets
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(model.ptr(), group, o);
    buckets[rank] = ddp.bucket_layout().size();
    seen[rank].push_back(ddp.last_step_stats());
    ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
    seen[rank].push_back(ddp.last_step_stats());
    {
      auto guard = ddp.no_sync();
      ddp.forward(model, batch_for(rank, 1)).pow(2).mean().backward();
    }
    seen[rank].push_back(ddp.last_step_stats());
    ddp.forward(model, batch_for(rank, 2)).pow(2).mean().backward();
    seen[rank].push_back(ddp.last_step_stats());
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_GE(buckets[r], 2u);
    EXPECT_EQ(seen[r][0].steps, 0u);
    EXPECT_EQ(seen[r][0].buckets, 0u);
    EXPECT_EQ(seen[r][0].backward_seconds, 0);
    EXPECT_EQ(seen[r][1].steps, 1u) << r;
    EXPECT_EQ(seen[r][1].buckets, buckets[r]) << r;
    EXPECT_EQ(seen[r][2].steps, 1u) << "a no_sync backward counted on rank " << r;
    EXPECT_EQ(seen[r][3].steps, 2u) << r;
    for (const DdpStats& s : {seen[r][1], seen[r][3]}) {
      EXPECT_GE(s.wait_seconds, 0) << r;
      EXPECT_GE(s.backward_seconds, s.wait_seconds) << r;
    }
  }
  // One rank with the default hook communicates nothing: no buckets, no wait.
  on_ranks(1, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    Mlp model = seeded_mlp(4);
    DistributedDataParallel ddp(model.ptr(), group, DdpOptions{.find_unused_parameters = true});
    ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
    DdpStats s = ddp.last_step_stats();
    EXPECT_EQ(s.steps, 1u);
    EXPECT_EQ(s.buckets, 0u);
    EXPECT_EQ(s.wait_seconds, 0);
    EXPECT_GE(s.backward_seconds, 0);
  });
}

// ---------------------------------------------------------------------------------
// Communication hooks and uneven inputs, on a model whose gradients are exact: two
// linear layers side by side under a loss linear in their outputs, on integer data, so
// every gradient is a small integer whatever the weights, sums over ranks are exact in
// any order, and a reference computed here with the same float operations (a sum, one
// division, the SGD step) agrees bit for bit. A buffer counts the forward passes.

struct ExactNetImpl : torch::nn::Module {
  ExactNetImpl() {
    a = register_module("a", torch::nn::Linear(4, 3));
    b = register_module("b", torch::nn::Linear(4, 2));
    steps = register_buffer("steps", torch::zeros({1}));
    // The same weights everywhere (the reference builds its own net), eighths.
    torch::NoGradGuard no_grad;
    double v = 0;
    for (auto& p : parameters()) {
      p.copy_((torch::arange(p.numel()).reshape(p.sizes()) + v) * 0.125 - 1);
      v += 3;
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    steps.add_(1);
    return torch::cat({a(x), b(x)}, 1);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  torch::Tensor steps;
};
TORCH_MODULE(ExactNet);

struct ExactBatch {
  torch::Tensor x, y;
};

// Integer-valued data of `rank` for `step`, from a private generator.
ExactBatch exact_batch(int rank, int step) {
  at::Generator gen = at::detail::createCPUGenerator(7919 * step + 31 * rank + 5);
  return {torch::randint(-3, 4, {6, 4}, gen, torch::kFloat), torch::randint(-3, 4, {6, 5}, gen, torch::kFloat)};
}

torch::Tensor exact_loss(const torch::Tensor& out, const ExactBatch& b) { return (out * b.y).sum(); }

// One bucket per parameter: a.weight, a.bias, b.weight, b.bias launch as buckets 3..0.
DdpOptions exact_options() {
  DdpOptions o;
  o.first_bucket_mb = 0;
  o.bucket_cap_mb = 0;
  return o;
}

// The gradient `rank` computes alone for `step` (registration order).
std::vector<torch::Tensor> local_gradients(int rank, int step) {
  ExactNet net;
  exact_loss(net->forward(exact_batch(rank, step).x), exact_batch(rank, step)).backward();
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.grad().clone());
  return out;
}

// The sum over `ranks` of their gradients for `step`.
std::vector<torch::Tensor> summed_gradients(const std::vector<int>& ranks, int step) {
  std::vector<torch::Tensor> sum;
  for (int r : ranks) {
    auto g = local_gradients(r, step);
    if (sum.empty()) sum = g;
    else for (size_t k = 0; k < g.size(); ++k) sum[k] = sum[k] + g[k];
  }
  return sum;
}

std::vector<int> all_ranks(int size) {
  std::vector<int> r(size);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// A hook that sums instead of averaging.
CommFuture sum_hook(GradBucket& bucket) {
  return CommFuture(bucket.group->allreduce(bucket.buffer, ReduceOp::kSum), bucket.buffer);
}

// Sums, then scales by 1/4 itself (exact for integers): the then() path.
CommFuture quarter_sum_hook(GradBucket& bucket) {
  return CommFuture(bucket.group->allreduce(bucket.buffer, ReduceOp::kSum), bucket.buffer)
      .then([](at::Tensor t) { return t * 0.25; });
}

// Each rank keeps its own gradients: no communication at all.
CommFuture local_hook(GradBucket& bucket) { return CommFuture(bucket.buffer); }

TEST(Ddp, CustomCommHooksGiveExactGradientsAndSeeTheirBuckets) {
  struct Case {
    const char* name;
    CommHook hook;
    double scale;  // of the sum over ranks; 0: each rank's own gradients
  };
  std::vector<Case> cases = {{"sum", sum_hook, 1.0}, {"quarter sum", quarter_sum_hook, 0.25},
                             {"local", local_hook, 0.0}};
  for (int size : {2, 3}) {
    std::vector<torch::Tensor> sum = summed_gradients(all_ranks(size), 0);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " on " + std::to_string(size) + " ranks");
      on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
        ExactNet net;
        DistributedDataParallel ddp(net.ptr(), group, exact_options());
        std::vector<size_t> seen_index;
        std::vector<std::vector<size_t>> seen_params;
        std::vector<bool> seen_last;
        ddp.register_comm_hook([&](GradBucket& bucket) {
          seen_index.push_back(bucket.index);
          seen_params.emplace_back(bucket.parameter_indices.begin(), bucket.parameter_indices.end());
          seen_last.push_back(bucket.is_last);
          EXPECT_EQ(bucket.divisor, size);
          EXPECT_EQ(bucket.group, &ddp.group());
          EXPECT_EQ(bucket.parameters.size(), bucket.parameter_indices.size());
          EXPECT_EQ(bucket.offsets.size(), bucket.parameter_indices.size());
          EXPECT_EQ(bucket.buffer.numel(), bucket.parameters[0].numel());
          return c.hook(bucket);
        });
        ExactBatch b = exact_batch(rank, 0);
        exact_loss(ddp.forward(net, b.x), b).backward();
        EXPECT_EQ(seen_index, std::vector<size_t>({0, 1, 2, 3}));
        EXPECT_EQ(seen_last, std::vector<bool>({false, false, false, true}));
        EXPECT_EQ(seen_params, ddp.bucket_layout());
        std::vector<torch::Tensor> own = local_gradients(rank, 0);
        auto params = net->parameters();
        for (size_t k = 0; k < params.size(); ++k) {
          torch::Tensor expected = c.scale == 0 ? own[k] : sum[k] * c.scale;
          EXPECT_TRUE(torch::equal(params[k].grad(), expected))
              << "rank " << rank << " parameter " << k << ": " << params[k].grad() << " vs " << expected;
        }
      });
    }
  }
}

// allreduce_hook and the compression hooks are what the options do, bit for bit.
TEST(Ddp, ReadyMadeHooksMatchTheOptions) {
  struct Case {
    Compression option;
    CommHook hook;
  };
  for (const Case& c : {Case{Compression::kNone, allreduce_hook},
                        Case{Compression::kFloat16, fp16_compress_hook},
                        Case{Compression::kBFloat16, bf16_compress_hook}}) {
    std::vector<std::vector<torch::Tensor>> grads[2];
    for (int registered = 0; registered < 2; ++registered) {
      grads[registered].resize(3);
      on_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
        Mlp model = seeded_mlp(11);
        DdpOptions o;
        o.find_unused_parameters = true;
        o.first_bucket_mb = 0.001;
        if (!registered) o.compression = c.option;
        DistributedDataParallel ddp(model.ptr(), group, o);
        if (registered) ddp.register_comm_hook(c.hook);
        ddp.forward(model, batch_for(rank, 0)).pow(2).mean().backward();
        for (auto& p : model->parameters()) grads[registered][rank].push_back(p.grad().clone());
      });
    }
    for (int r = 0; r < 3; ++r) {
      for (size_t k = 0; k < grads[0][r].size(); ++k) {
        EXPECT_TRUE(torch::equal(grads[0][r][k], grads[1][r][k]))
            << "compression " << static_cast<int>(c.option) << " rank " << r << " parameter " << k;
      }
    }
  }
}

TEST(Ddp, RegisterCommHookOnlyOnceBeforeTraining) {
  on_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    {
      ExactNet net;
      DistributedDataParallel ddp(net.ptr(), group, exact_options());
      EXPECT_TRUE(test::contains(test::error_of<InvalidArgumentError>([&] { ddp.register_comm_hook(nullptr); }),
                                 "empty"));
      ddp.register_comm_hook(sum_hook);
      std::string twice = test::error_of<InvalidArgumentError>([&] { ddp.register_comm_hook(sum_hook); });
      EXPECT_TRUE(test::contains(twice, "already registered")) << twice;
    }
    {
      ExactNet net;
      DistributedDataParallel ddp(net.ptr(), group, exact_options());
      ExactBatch b = exact_batch(rank, 0);
      exact_loss(ddp.forward(net, b.x), b).backward();
      std::string late = test::error_of<InvalidArgumentError>([&] { ddp.register_comm_hook(sum_hook); });
      EXPECT_TRUE(test::contains(late, "before the first backward")) << late;
    }
    {
      ExactNet net;
      DdpOptions o = exact_options();
      o.compression = Compression::kFloat16;
      DistributedDataParallel ddp(net.ptr(), group, o);
      std::string both = test::error_of<InvalidArgumentError>([&] { ddp.register_comm_hook(sum_hook); });
      EXPECT_TRUE(test::contains(both, "compression")) << both;
    }
  });
}

// A hook that throws on one rank, a hook whose Work fails (a collective the ranks
// disagree on) and a result of the wrong size: backward() throws on every rank, naming
// the bucket where it happened, and no rank hangs.
TEST(Ddp, FailingCommHooksFailBackwardOnEveryRankNamingTheBucket) {
  struct Case {
    const char* name;
    std::function<CommFuture(int rank, GradBucket&)> hook;
    std::string on_culprit;  // expected in the message of rank 1
  };
  std::vector<Case> cases = {
      {"throws",
       [](int rank, GradBucket& b) {
         if (rank == 1 && b.index == 2) throw std::runtime_error("hook refused");
         return allreduce_hook(b);
       },
       "hook refused"},
      {"work fails",
       [](int rank, GradBucket& b) {
         at::Tensor t = rank == 1 && b.index == 2 ? b.buffer.narrow(0, 0, 1) : b.buffer;
         return CommFuture(b.group->allreduce(t, ReduceOp::kSum), b.buffer);
       },
       "allreduce"},
      {"wrong size",
       [](int rank, GradBucket& b) {
         CommFuture f = allreduce_hook(b);
         if (rank == 1 && b.index == 2) return f.then([](at::Tensor t) { return t.narrow(0, 0, 1); });
         return f;
       },
       "elements"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> errors(3);
    try {
      on_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
        ExactNet net;
        DistributedDataParallel ddp(net.ptr(), group, exact_options());
        ddp.register_comm_hook([&](GradBucket& b) { return c.hook(rank, b); });
        // Two steps: a rank whose own part succeeded learns of the failure at its next
        // collective (from the culprit's abort, whose reason names the bucket).
        errors[rank] = test::error_of<Error>([&] {
          for (int step = 0; step < 2; ++step) {
            ExactBatch b = exact_batch(rank, step);
            exact_loss(ddp.forward(net, b.x), b).backward();
          }
        });
      });
    } catch (const test::RankFailure&) {
    }
    EXPECT_TRUE(test::contains(errors[1], "bucket 2")) << errors[1];
    EXPECT_TRUE(test::contains(errors[1], c.on_culprit)) << errors[1];
    EXPECT_TRUE(test::contains(errors[1], "a.bias")) << errors[1];  // bucket 2's parameter
    for (int r : {0, 2}) EXPECT_TRUE(test::contains(errors[r], "bucket")) << "rank " << r << ": " << errors[r];
  }
}

// The reference for uneven inputs: `batches[r]` steps on rank r, SGD with momentum on
// the sum over the ranks still training of their gradients, divided as asked (0: by
// nothing, for the summing hook).
std::vector<torch::Tensor> uneven_reference(const std::vector<int>& batches, int divisor_mode,
                                            int micro = 1) {
  const int size = static_cast<int>(batches.size());
  ExactNet net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.25).momentum(0.5));
  int steps = *std::max_element(batches.begin(), batches.end());
  for (int s = 0; s < steps; ++s) {
    std::vector<int> active;
    for (int r = 0; r < size; ++r) if (batches[r] > s) active.push_back(r);
    std::vector<torch::Tensor> sum = summed_gradients(active, micro * s);
    for (int m = 1; m < micro; ++m) {
      auto more = summed_gradients(active, micro * s + m);
      for (size_t k = 0; k < sum.size(); ++k) sum[k] = sum[k] + more[k];
    }
    auto params = net->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      int d = divisor_mode == 0 ? 1 : divisor_mode == 1 ? size : static_cast<int>(active.size());
      params[k].mutable_grad() = d == 1 ? sum[k] : sum[k] / d;
    }
    opt.step();
  }
  return snapshot(*net);
}

// Trains ExactNet on `batches[rank]` steps of `micro` micro-batches (all but the last
// under no_sync) inside UnevenInputs, then joins. Checks every rank ends with the
// reference's parameters bit for bit and the buffer of the longest-training rank.
void check_uneven(const std::vector<int>& batches, int divisor_mode, int micro = 1) {
  SCOPED_TRACE("divisor mode " + std::to_string(divisor_mode) + ", micro-batches " + std::to_string(micro));
  const int size = static_cast<int>(batches.size());
  std::vector<torch::Tensor> expected = uneven_reference(batches, divisor_mode, micro);
  std::vector<std::vector<torch::Tensor>> final(size);
  std::vector<torch::Tensor> steps(size);
  on_ranks(size, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    ExactNet net;
    DistributedDataParallel ddp(net.ptr(), group, exact_options());
    if (divisor_mode == 0) ddp.register_comm_hook(sum_hook);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.25).momentum(0.5));
    {
      auto guard = ddp.uneven_inputs({.divide_by_initial_world_size = divisor_mode == 1});
      for (int s = 0; s < batches[rank]; ++s) {
        opt.zero_grad();
        for (int m = 0; m < micro; ++m) {
          ExactBatch b = exact_batch(rank, micro * s + m);
          if (m + 1 < micro) {
            auto no_sync = ddp.no_sync();
            exact_loss(ddp.forward(net, b.x), b).backward();
          } else {
            exact_loss(ddp.forward(net, b.x), b).backward();
          }
        }
        opt.step();
      }
      ddp.join();
    }
    final[rank] = snapshot(*net);
    steps[rank] = net->steps.clone();
  });
  int longest = *std::max_element(batches.begin(), batches.end());
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(final[r].size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_TRUE(torch::equal(final[r][k], expected[k]))
          << "rank " << r << " parameter " << k << ":\n" << final[r][k] << "\nexpected\n" << expected[k];
    }
    // Buffers came from a rank still training each step, and from the last at the end.
    EXPECT_EQ(steps[r].item<float>(), static_cast<float>(longest * micro)) << "rank " << r;
  }
}

TEST(Ddp, JoinThreeRanksWithUnevenBatches) {
  for (int mode : {1, 2, 0}) check_uneven({2, 5, 3}, mode);
}

TEST(Ddp, JoinTwoRanksOneWithoutBatches) {
  for (int mode : {1, 2, 0}) check_uneven({0, 4}, mode);
  check_uneven({3, 3}, 2);  // nobody joins early
  check_uneven({0, 0}, 1);  // nobody trains
}

TEST(Ddp, JoinWithNoSyncAccumulatesOnTheTrainingRanks) {
  for (int mode : {1, 2}) check_uneven({4, 2, 3}, mode, /*micro=*/2);
}

TEST(Ddp, JoinRefusesMisuse) {
  // Training ranks of one step that disagree on no_sync: every rank is told.
  std::vector<std::string> errors(3);
  on_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    ExactNet net;
    DistributedDataParallel ddp(net.ptr(), group, exact_options());
    auto guard = ddp.uneven_inputs();
    ExactBatch b = exact_batch(rank, 0);
    errors[rank] = test::error_of<InvalidArgumentError>([&] {
      if (rank == 0) {
        ddp.join();
      } else if (rank == 1) {
        auto no_sync = ddp.no_sync();
        exact_loss(ddp.forward(net, b.x), b).backward();
      } else {
        exact_loss(ddp.forward(net, b.x), b).backward();
      }
    });
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(test::contains(errors[r], "no_sync")) << "rank " << r << ": " << errors[r];

  on_ranks(2, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    ExactNet net;
    DistributedDataParallel ddp(net.ptr(), group, exact_options());
    std::string outside = test::error_of<InvalidArgumentError>([&] { ddp.join(); });
    EXPECT_TRUE(test::contains(outside, "uneven_inputs")) << outside;
    auto guard = ddp.uneven_inputs();
    ddp.join();
    std::string twice = test::error_of<InvalidArgumentError>([&] { ddp.join(); });
    EXPECT_TRUE(test::contains(twice, "already joined")) << twice;
    ExactBatch b = exact_batch(rank, 0);
    std::string after = test::error_of<InvalidArgumentError>([&] { ddp.forward(net, b.x); });
    EXPECT_TRUE(test::contains(after, "joined")) << after;
  });
}

TEST(ProcessGroupTest, CollectivesOverTensors) {
  on_ranks(3, [&](int rank, std::shared_ptr<ProcessGroup> group) {
    torch::Tensor t = torch::full({2, 3}, rank + 1.0);
    group->allreduce(t).wait();
    EXPECT_TRUE(torch::equal(t, torch::full({2, 3}, 6.0)));
    torch::Tensor b = torch::arange(4, torch::kInt64) * (rank == 2 ? 1 : 0);
    group->broadcast(b, 2).wait();
    EXPECT_TRUE(torch::equal(b, torch::arange(4, torch::kInt64)));
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < 3; ++r) parts.push_back(torch::empty({2}, torch::kBFloat16));
    group->allgather(parts, torch::full({2}, rank * 2.0, torch::kBFloat16)).wait();
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(torch::equal(parts[r], torch::full({2}, r * 2.0, torch::kBFloat16)));
    torch::Tensor out = torch::empty({2});
    group->reduce_scatter(out, torch::ones({6}), ReduceOp::kSum).wait();
    EXPECT_TRUE(torch::equal(out, torch::full({2}, 3.0)));
  });
}

TEST(ProcessGroupTest, BadTensorsAreRefusedWithClearErrors) {
  on_ranks(2, [&](int, std::shared_ptr<ProcessGroup> group) {
    auto message = [](const std::function<void()>& fn) {
      try {
        fn();
      } catch (const InvalidArgumentError& e) {
        return std::string(e.what());
      }
      return std::string("<no error>");
    };
    torch::Tensor strided = torch::ones({4, 4}).t();
    EXPECT_NE(message([&] { group->allreduce(strided); }).find("not contiguous"), std::string::npos);
    torch::Tensor boolean = torch::ones({3}, torch::kBool);
    EXPECT_NE(message([&] { group->allreduce(boolean); }).find("Bool"), std::string::npos);
    std::vector<torch::Tensor> wrong(2, torch::empty({5}));
    EXPECT_NE(message([&] { group->allgather(wrong, torch::ones({4})); }).find("does not match"),
              std::string::npos);
    std::vector<torch::Tensor> few(1, torch::empty({4}));
    EXPECT_NE(message([&] { group->allgather(few, torch::ones({4})); }).find("one per rank"),
              std::string::npos);
    EXPECT_NE(message([&] { group->reduce_scatter(torch::empty({3}), torch::ones({4})); })
                  .find("blocks"),
              std::string::npos);
    EXPECT_NE(message([&] { group->allreduce(torch::Tensor()); }).find("undefined"), std::string::npos);
    // Still usable afterwards.
    torch::Tensor t = torch::ones({3});
    group->allreduce(t).wait();
    EXPECT_TRUE(torch::equal(t, torch::full({3}, 2.0)));
  });
}

}  // namespace
}  // namespace chorus::torch_ext
