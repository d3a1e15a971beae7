// chorus-mnist's command line and its checks (args.h).
#include "args.h"

#include <CLI/CLI.hpp>

#include <cstdio>

#include "chorus/version.h"

namespace chorus::mnist {

std::string mismatch(const Args& a, const chorus::torch_ext::TrainingState& state) {
  if (state.world_size == 0) return "";
  if (state.global_batch != a.batch_size) {
    return "it was written with a global batch of " + std::to_string(state.global_batch) +
           ", --batch-size is " + std::to_string(a.batch_size) +
           " (the global batch stays when the world size changes)";
  }
  if (state.sampler_seed != a.seed) {
    return "its sampler was seeded with " + std::to_string(state.sampler_seed) + ", --seed is " +
           std::to_string(a.seed);
  }
  return "";
}

int parse(int argc, char** argv, Args& a) {
  CLI::App app{"chorus-mnist: the seed job (DistributedDataParallel on Fashion-MNIST/MNIST)"};
  app.add_option("--model", a.model, "mlp (784-512-512-10) or linear (784->10)")
      ->check(CLI::IsMember({"mlp", "linear"}));
  app.add_option("--dataset", a.dataset, "fashion or mnist")->check(CLI::IsMember({"fashion", "mnist"}));
  app.add_option("--data-dir", a.data_dir,
                 "directory of the IDX files (default for fashion: /usr/share/datasets/fashion-mnist)");
  app.add_option("--epochs", a.epochs, "epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "global batch size, split across ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", a.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", a.seed, "torch.manual_seed and the sampler's seed");
  app.add_option("--log-interval", a.log_interval, "print the loss every N batches")
      ->check(CLI::PositiveNumber);
  app.add_option("--workers", a.workers, "data loader threads (0: load on the training thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", a.checkpoint_dir, "rank 0 writes checkpoint.pt here");
  app.add_option("--checkpoint-interval", a.checkpoint_interval,
                 "also checkpoint every N steps, so that a crash loses fewer than N (0: only at "
                 "epoch ends)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", a.resume, "continue from <checkpoint-dir>/checkpoint.pt if present");
  app.add_option("--device", a.device, "cpu")->check(CLI::IsMember({"cpu"}));
  app.add_option("--max-steps", a.max_steps, "stop after N optimizer steps (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-steps", a.warmup_steps,
                 "first N steps are not timed in samples_per_second (benchmarks)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", a.threads, "intra-op threads (0: OMP_NUM_THREADS or 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", a.metrics,
                 "rank 0 writes JSON lines here: loss, samples/s, time per step split into "
                 "compute and waiting on allreduce, test accuracy (scripts/plot draws them)");
  app.add_option("--sample-log", a.sample_log,
                 "every rank appends a line per step: epoch, step, rank, world size and the "
                 "sample indices it trained on");
  app.set_version_flag("--version", std::string("chorus-mnist ") + CHORUS_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? -1 : 2;
  }
  if (a.resume && a.checkpoint_dir.empty()) {
    std::fprintf(stderr, "chorus-mnist: --resume needs --checkpoint-dir\n");
    return 2;
  }
  if (a.data_dir.empty()) {
    if (a.dataset == "mnist") {
      std::fprintf(stderr, "chorus-mnist: --dataset mnist needs --data-dir (Debian packages only "
                           "Fashion-MNIST)\n");
      return 2;
    }
    a.data_dir = "/usr/share/datasets/fashion-mnist";
  }
  return 0;
}

bool batch_divides(const Args& a, int world) {
  if (a.batch_size % world == 0) return true;
  // The global batch is what a step trains on, at any world size (a job resumed on
  // fewer or more ranks keeps it, so that it continues the same training).
  std::fprintf(stderr,
               "chorus-mnist: the global batch (--batch-size %lld) is not divisible by the %d "
               "ranks; each rank trains on global batch / ranks samples per step\n",
               static_cast<long long>(a.batch_size), world);
  return false;
}

std::string checkpoint_path(const Args& a) {
  return a.checkpoint_dir.empty() ? "" : a.checkpoint_dir + "/checkpoint.pt";
}

}  // namespace chorus::mnist
