// plain-libtorch-mnist: chorus-mnist's job (MLP 784-512-512-10 on Fashion-MNIST, SGD,
// batch 512, DistributedSampler order for one replica) as a plain libtorch loop on one
// process, with no communication at all: the baseline that 1-rank chorus-mnist is
// compared with by bench/compare_mnist.sh.
//
// Prints chorus-mnist's JSON line. --max-steps counts every optimizer step, as in
// chorus-mnist; the first --warmup-steps of them are not timed, and samples_per_second
// is over the timed steps only.
//
// With --lockstep FILE, --lockstep-rank and --lockstep-size, that many of these loops
// wait for each other once a step (bench/lockstep.h), where DistributedDataParallel
// waits for its gradients: the synchronised ceiling of bench/compare_mnist.sh.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "chorus/torch/data.h"
#include "lockstep.h"
#include "models.h"          // apps/chorus-mnist/models.h
#include "process_tuning.h"  // apps/chorus-mnist/process_tuning.h

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 5;
  int64_t batch_size = 512;
  double lr = 1e-3;
  uint64_t seed = 0;
  int64_t workers = 1;  // chorus-mnist's default
  int64_t max_steps = 0;
  int64_t warmup_steps = 0;
  int threads = 0;
  std::string lockstep;  // the file of the processes' barrier; empty: none
  int lockstep_rank = 0, lockstep_size = 1;
  std::string malloc_thresholds;  // what keep_freed_memory() did (not an option)
};

// chorus-mnist's model, from the same header.
using chorus::mnist::Mlp;

int parse(int argc, char** argv, Args& a) {
  CLI::App app{"plain-libtorch-mnist: chorus-mnist's job as a plain libtorch loop (no communication)"};
  app.add_option("--data-dir", a.data_dir, "directory of the Fashion-MNIST IDX files");
  app.add_option("--epochs", a.epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "torch::manual_seed and the sampler's seed");
  app.add_option("--workers", a.workers, "data loader threads (0: load on the training thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-steps", a.max_steps, "stop after N optimizer steps, warm-up included (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-steps", a.warmup_steps, "the first N steps are not timed")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", a.threads, "intra-op threads (0: OMP_NUM_THREADS or 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lockstep", a.lockstep,
                 "meet the other processes at a barrier in this file (8 zero bytes) after every backward");
  app.add_option("--lockstep-rank", a.lockstep_rank, "this process's place among them")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lockstep-size", a.lockstep_size, "how many processes meet")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? -1 : 2;
  }
  if (a.max_steps > 0 && a.warmup_steps >= a.max_steps) {
    std::fprintf(stderr, "plain-libtorch-mnist: --warmup-steps must be below --max-steps\n");
    return 2;
  }
  if (!a.lockstep.empty() && a.lockstep_rank >= a.lockstep_size) {
    std::fprintf(stderr, "plain-libtorch-mnist: --lockstep-rank must be below --lockstep-size\n");
    return 2;
  }
  return 0;
}

std::shared_ptr<const chorus::data::MnistDataset> load_split(const Args& a, chorus::data::Split split) {
  chorus::data::MnistOptions o;
  o.directory = a.data_dir;
  o.split = split;
  o.layout = chorus::data::ImageLayout::kFlat;
  return chorus::data::MnistDataset::load(o);
}

std::pair<double, double> evaluate(Mlp& model, std::shared_ptr<const chorus::data::MnistDataset> test) {
  torch::NoGradGuard no_grad;
  model->eval();
  chorus::data::DataLoaderOptions lo;
  lo.batch_size = 1000;
  chorus::data::DataLoader loader(test, lo);
  double loss = 0, correct = 0;
  int64_t batches = 0;
  while (auto b = loader.next()) {
    torch::Tensor out = model->forward(b->data);
    loss += torch::nn::functional::cross_entropy(out, b->target).item<double>();
    correct += out.argmax(1).eq(b->target).sum().item<double>();
    ++batches;
  }
  model->train();
  return {correct / static_cast<double>(test->size()), loss / static_cast<double>(batches)};
}

int train(const Args& a) {
  auto train_set = load_split(a, chorus::data::Split::kTrain);
  auto test_set = load_split(a, chorus::data::Split::kTest);
  torch::manual_seed(a.seed);
  Mlp model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr));
  chorus::data::DistributedSamplerOptions so;  // one replica, rank 0
  so.seed = a.seed;
  chorus::data::DistributedSampler sampler(train_set->size(), so);

  std::unique_ptr<chorus::bench::Lockstep> lockstep;
  if (!a.lockstep.empty()) {
    lockstep = std::make_unique<chorus::bench::Lockstep>(a.lockstep, a.lockstep_rank, a.lockstep_size,
                                                         std::chrono::seconds(60));
  }
  int64_t step = 0, timed_samples = 0;
  double train_seconds = 0;
  const auto wall_start = Clock::now();
  bool stop = false;
  for (int64_t epoch = 0; epoch < a.epochs && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    chorus::data::DataLoaderOptions lo;
    lo.batch_size = a.batch_size;
    lo.drop_last = true;
    lo.workers = a.workers;
    chorus::data::DataLoader loader(train_set, sampler.epoch_indices(), lo);
    auto start = Clock::now();  // of the timed part of this epoch
    while (auto b = loader.next()) {
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(b->data), b->target);
      optimizer.zero_grad();
      loss.backward();
      if (lockstep) lockstep->arrive_and_wait(step + 1);
      optimizer.step();
      ++step;
      if (step <= a.warmup_steps) {
        start = Clock::now();
      } else {
        timed_samples += b->size();
      }
      if (a.max_steps > 0 && step >= a.max_steps) {
        stop = true;
        break;
      }
    }
    if (step > a.warmup_steps) train_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const auto [accuracy, test_loss] = evaluate(model, test_set);
  nlohmann::json j = {{"epochs", a.epochs},
                      {"ranks", 1},
                      {"lockstep", a.lockstep.empty() ? 0 : a.lockstep_size},
                      {"steps", step},
                      {"warmup_steps", a.warmup_steps},
                      {"samples_per_second", train_seconds > 0 ? timed_samples / train_seconds : 0.0},
                      {"train_seconds", train_seconds},
                      {"wall_time_s", std::chrono::duration<double>(Clock::now() - wall_start).count()},
                      {"test_accuracy", accuracy},
                      {"test_loss", test_loss},
                      {"blas", chorus::mnist::openblas_core()},
                      {"malloc_thresholds", a.malloc_thresholds}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  chorus::mnist::prefer_native_blas_kernels(argc, argv);
  Args a;
  if (int rc = parse(argc, argv, a)) return rc < 0 ? 0 : rc;
  a.malloc_thresholds = chorus::mnist::keep_freed_memory();  // as chorus-mnist does
  try {
    chorus::mnist::set_compute_threads(a.threads);
    return train(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plain-libtorch-mnist: %s\n", e.what());
    return 1;
  }
}
