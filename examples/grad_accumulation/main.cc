// Gradient accumulation: each optimizer step sums the gradients of --accumulate
// micro-batches. The first ones run their backward inside DistributedDataParallel's
// no_sync(), which keeps the gradients local. The last one's backward averages the sums
// over the ranks. One step thus moves the gradients once, whatever the accumulation.
//
// Checkpoints: every --checkpoint-every steps rank 0 writes DIR/checkpoint.pt. The file
// holds the model, the optimizer (momentum included), the epoch and the sampler's
// position, and is written atomically. --resume continues from it. A run stopped after
// any checkpoint and resumed ends with exactly the parameters of a run that was never
// stopped (the tests compare the checksums).
//
//   chorusrun --standalone --nproc-per-node 2 ./grad_accumulation --steps 40 \
//       --checkpoint DIR [--checkpoint-every 10] [--stop-after N] [--resume] [--accumulate 4]
#include <chorus/torch/checkpoint.h>
#include <chorus/torch/checksum.h>
#include <chorus/torch/data.h>
#include <chorus/torch/ddp.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace {

struct Args {
  int64_t steps = 40, accumulate = 4, micro_batch = 32, checkpoint_every = 10, stop_after = 0;
  bool resume = false;
  std::string checkpoint_dir, data_dir = "/usr/share/datasets/fashion-mnist";
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--resume") {
      a.resume = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "grad_accumulation: %s needs a value\n", argv[i]);
      return false;
    }
    const char* v = argv[++i];
    if (arg == "--steps") a.steps = std::atoll(v);
    else if (arg == "--accumulate") a.accumulate = std::atoll(v);
    else if (arg == "--micro-batch") a.micro_batch = std::atoll(v);
    else if (arg == "--checkpoint-every") a.checkpoint_every = std::atoll(v);
    else if (arg == "--stop-after") a.stop_after = std::atoll(v);
    else if (arg == "--checkpoint") a.checkpoint_dir = v;
    else if (arg == "--data-dir") a.data_dir = v;
    else {
      std::fprintf(stderr, "grad_accumulation: unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  if (a.steps < 1 || a.accumulate < 1 || a.micro_batch < 1 || a.checkpoint_every < 1 || a.stop_after < 0) {
    std::fprintf(stderr, "grad_accumulation: counts must be positive\n");
    return false;
  }
  if (a.resume && a.checkpoint_dir.empty()) {
    std::fprintf(stderr, "grad_accumulation: --resume needs --checkpoint DIR\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 2;
  try {
    auto group = chorus::torch_ext::ProcessGroup::from_env();
    const int rank = group->rank(), world = group->size();
    torch::manual_seed(0);
    auto model = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 128), torch::nn::ReLU(),
                                       torch::nn::Linear(128, 10));
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    chorus::torch_ext::TrainingState state;
    const std::string path = a.checkpoint_dir.empty() ? "" : a.checkpoint_dir + "/checkpoint.pt";
    if (a.resume) {
      // Every rank loads the same file: rank 0 wrote it, and all ranks see it here.
      if (auto loaded = chorus::torch_ext::load_checkpoint(path, *model, optimizer)) state = *loaded;
      if (rank == 0) std::printf("resuming at step %lld\n", static_cast<long long>(state.step));
    }
    if (rank == 0 && !path.empty()) std::filesystem::create_directories(a.checkpoint_dir);
    // After the load: DDP broadcasts rank 0's parameters, equal to the others' anyway.
    chorus::torch_ext::DistributedDataParallel ddp(model.ptr(), group);

    chorus::data::MnistOptions mo;
    mo.directory = a.data_dir;
    mo.layout = chorus::data::ImageLayout::kFlat;
    auto train = chorus::data::MnistDataset::load(mo);
    chorus::data::DistributedSamplerOptions so;
    so.num_replicas = world;
    so.rank = rank;
    chorus::data::DistributedSampler sampler(train->size(), so);
    sampler.set_epoch(state.epoch);
    if (state.sampler_position > 0) sampler.load_state({state.epoch, state.sampler_position});
    auto loader_for = [&] {
      chorus::data::DataLoaderOptions lo;
      lo.batch_size = a.micro_batch;
      lo.drop_last = true;
      return std::make_unique<chorus::data::DataLoader>(train, sampler.remaining_indices(), lo);
    };
    auto loader = loader_for();
    // The next micro-batch, starting the next epoch where this one ends.
    auto next_batch = [&] {
      auto b = loader->next();
      if (!b) {
        state.epoch += 1;
        sampler.set_epoch(state.epoch);
        loader = loader_for();
        b = loader->next();
      }
      sampler.advance(b->size());
      return *b;
    };
    const int64_t started_at = state.step;
    while (state.step < a.steps) {
      optimizer.zero_grad();
      double loss_sum = 0;
      for (int64_t m = 0; m < a.accumulate; ++m) {
        chorus::data::Batch b = next_batch();
        // Each micro-batch's loss is scaled so that the step's gradient is the mean
        // over all accumulate x micro_batch samples (and over the ranks, by DDP).
        auto micro_loss = [&] {
          torch::Tensor loss = torch::nn::functional::cross_entropy(ddp.forward(model, b.data), b.target);
          loss_sum += loss.item<double>();
          (loss / static_cast<double>(a.accumulate)).backward();
        };
        if (m + 1 < a.accumulate) {
          auto local = ddp.no_sync();  // gradients add up here, no communication
          micro_loss();
        } else {
          micro_loss();  // this backward averages the accumulated sums over the ranks
        }
      }
      optimizer.step();
      ++state.step;
      state.sampler_position = sampler.position();
      if (rank == 0 && state.step % 10 == 0) {
        std::printf("step %lld: loss %.5f\n", static_cast<long long>(state.step), loss_sum / a.accumulate);
        std::fflush(stdout);
      }
      if (!path.empty() && state.step % a.checkpoint_every == 0) {
        if (rank == 0) chorus::torch_ext::save_checkpoint(path, *model, optimizer, state);
        // Nobody reads the file (a resume) before it is whole.
        group->barrier().wait();
      }
      if (a.stop_after > 0 && state.step - started_at == a.stop_after) {
        if (rank == 0) std::printf("stopping after step %lld\n", static_cast<long long>(state.step));
        break;
      }
    }
    std::printf("rank %d step %lld checksum %s\n", rank, static_cast<long long>(state.step),
                chorus::torch_ext::state_checksum(*model).c_str());
    group->barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grad_accumulation: %s\n", e.what());
    return 1;
  }
}
