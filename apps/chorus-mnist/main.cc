// chorus-mnist: the seed job. An MLP (784-512-512-10, seed 000) or a linear model
// (784->10 with Normalize(0.5, 0.5), seed 001) trained on Fashion-MNIST or MNIST with
// DistributedDataParallel over chorus; started by chorusrun (or alone as one rank).
//
// Output: rank 0 draws a progress bar when stdout is a terminal, else every rank
// prints the seed job's plain lines. --metrics FILE: rank 0 writes JSON lines there
// (see MetricsFile, outputs.h), which scripts/plot draws.
//
// This file sets a rank up: the command line (args.h), the data, the sampler, the
// checkpoint to resume from, the output files (outputs.h); the Trainer (trainer.h)
// then runs its epochs and steps.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "args.h"
#include "chorus/torch/checkpoint.h"
#include "chorus/torch/data.h"
#include "models.h"
#include "outputs.h"
#include "process_tuning.h"
#include "trainer.h"

namespace chorus::mnist {
namespace {

std::shared_ptr<const chorus::data::MnistDataset> load_split(const Args& a, chorus::data::Split split) {
  chorus::data::MnistOptions o;
  o.directory = a.data_dir;
  o.split = split;
  o.layout = chorus::data::ImageLayout::kFlat;
  if (a.model == "linear") o.normalize = chorus::data::Normalize{0.5, 0.5};
  return chorus::data::MnistDataset::load(o);
}

chorus::data::DistributedSamplerOptions sampler_options(const Args& a, int rank, int world) {
  chorus::data::DistributedSamplerOptions so;
  so.num_replicas = world;
  so.rank = rank;
  so.seed = a.seed;
  // Every epoch is floor(n / global batch) full steps at any world size, and the rest
  // of the permutation is never trained on in that epoch. Without drop_last the ranks
  // would pad when the world size does not divide n, and a last step could repeat
  // samples; the first floor(n / world) indices of every rank are the same either way.
  so.drop_last = true;
  return so;
}

// --resume: the checkpoint, where there is one, into `model`, `optimizer` and `state`.
// False when it cannot be continued with these arguments (said on stderr).
bool resume_from_checkpoint(const Args& a, int rank, int world, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer, chorus::torch_ext::TrainingState& state) {
  const std::string ckpt = checkpoint_path(a);
  auto loaded = chorus::torch_ext::load_checkpoint(ckpt, model, optimizer);
  if (!loaded) return true;
  state = *loaded;
  if (std::string why = mismatch(a, state); !why.empty()) {
    std::fprintf(stderr, "chorus-mnist: cannot resume from %s: %s\n", ckpt.c_str(), why.c_str());
    return false;
  }
  if (rank == 0) {
    std::printf("resumed from %s: epoch %lld, step %lld, %lld samples of the epoch consumed, "
                "written by %lld ranks, now %d\n",
                ckpt.c_str(), static_cast<long long>(state.epoch), static_cast<long long>(state.step),
                static_cast<long long>(state.consumed_by_all(world)),
                static_cast<long long>(state.world_size > 0 ? state.world_size : world), world);
  }
  return true;
}

// --sample-log: false when the file cannot be opened (said on stderr).
bool open_sample_log(const Args& a, SampleLog& sample_log) {
  const std::string why = sample_log.open(a.sample_log);
  if (why.empty()) return true;
  std::fprintf(stderr, "chorus-mnist: cannot append to the --sample-log file %s: %s\n",
               a.sample_log.c_str(), why.c_str());
  return false;
}

// One rank's run: its set-up, in the order in which its refusals are reported (the
// data, the global batch, the checkpoint to resume from, the sample log), then its
// epochs. 0, 2 where the set-up refuses (said on stderr), or
// kStoppedAtCheckpointStatus.
template <class Model>
int train(const Args& a, Model model, std::shared_ptr<ProcessGroup> group, MetricsFile& metrics) {
  const int rank = group->rank(), world = group->size();
  const Data data{load_split(a, chorus::data::Split::kTrain), load_split(a, chorus::data::Split::kTest)};
  if (!batch_divides(a, world)) return 2;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(a.momentum));
  chorus::data::DistributedSampler sampler(data.train->size(), sampler_options(a, rank, world));
  chorus::torch_ext::TrainingState state;
  if (a.resume && !resume_from_checkpoint(a, rank, world, *model, optimizer, state)) return 2;
  SampleLog sample_log;
  if (!a.sample_log.empty() && !open_sample_log(a, sample_log)) return 2;
  if (!a.checkpoint_dir.empty() && rank == 0) std::filesystem::create_directories(a.checkpoint_dir);
  Trainer<Model> trainer(a, model, group, data, optimizer, sampler, state, sample_log, metrics);
  return trainer.run();
}

}  // namespace
}  // namespace chorus::mnist

int main(int argc, char** argv) {
  chorus::mnist::prefer_native_blas_kernels(argc, argv);
  chorus::mnist::Args a;
  if (int rc = chorus::mnist::parse(argc, argv, a)) return rc < 0 ? 0 : rc;
  a.malloc_thresholds = chorus::mnist::keep_freed_memory();
  // Rank 0 (RANK, as chorusrun sets it; 0 when alone) opens the metrics file before
  // anything else, so that a bad path fails at once.
  chorus::mnist::MetricsFile metrics;
  const char* rank_env = std::getenv("RANK");
  if (!a.metrics.empty() && (rank_env == nullptr || std::atoi(rank_env) == 0)) {
    std::string why = metrics.open(a.metrics);
    if (!why.empty()) {
      std::fprintf(stderr, "chorus-mnist: cannot write the --metrics file %s: %s\n", a.metrics.c_str(),
                   why.c_str());
      return 2;
    }
  }
  try {
    chorus::mnist::set_compute_threads(a.threads);
    auto group = chorus::torch_ext::ProcessGroup::from_env();
    // As in seed 000: the seed is set before the model is built, so every rank builds
    // the same initial weights (DDP's broadcast from rank 0 then changes nothing).
    torch::manual_seed(a.seed);
    if (a.model == "mlp") return chorus::mnist::train(a, chorus::mnist::Mlp(), group, metrics);
    return chorus::mnist::train(a, chorus::mnist::Linear(), group, metrics);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-mnist: %s\n", e.what());
    return 1;
  }
}
