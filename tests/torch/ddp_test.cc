// DistributedDataParallel with ranks as threads: replicas start equal, gradients are
// the average over ranks, parameters stay bitwise identical, no_sync accumulates,
// unused parameters, compression, bucket layout.
#include <gtest/gtest.h>
#include <torch/torch.h>

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
