// Training checkpoints: model, optimizer, epoch, step and sampler position in one file,
// written atomically so that a crash never leaves a torn checkpoint behind.
//
// save_checkpoint writes <path>.tmp, fsyncs it, renames it over <path> and fsyncs the
// directory: a reader sees the old checkpoint or the new one, never a mix. In a job,
// rank 0 saves (the replicas are identical) and every rank loads.
// Errors: chorus::SystemError for I/O failures (naming the path and errno text);
// chorus::InvalidArgumentError for a file that is not a checkpoint of this model.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

namespace chorus::torch_ext {

struct TrainingState {
  int64_t epoch = 0;            // the epoch in progress
  int64_t step = 0;             // optimizer steps taken in the whole run
  int64_t sampler_position = 0; // samples of `epoch` this rank has consumed
  // What a job of another world size needs to continue exactly where this one
  // stopped (docs/training.md, "Resuming at a different world size"):
  int64_t world_size = 0;    // ranks of the job that wrote it; 0: not recorded
  int64_t consumed = 0;      // samples of `epoch` all ranks consumed together
                             // (DistributedSampler::consumed())
  int64_t global_batch = 0;  // samples per optimizer step, all ranks; 0: not recorded
  uint64_t sampler_seed = 0; // DistributedSamplerOptions::seed

  // Samples of `epoch` consumed by all ranks together. A checkpoint from before
  // these fields (world_size 0) could only be resumed at the world size that
  // wrote it, so it is taken to be `loading_world_size`'s: sampler_position of
  // each of its ranks.
  int64_t consumed_by_all(int64_t loading_world_size) const {
    return world_size > 0 ? consumed : sampler_position * loading_world_size;
  }
};

void save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state);

// Loads a checkpoint written by save_checkpoint into `model` and `optimizer`. Returns
// nullopt when `path` does not exist. A checkpoint written before world_size,
// consumed, global_batch and sampler_seed were recorded loads with them 0 (see
// consumed_by_all). The training state is read and checked (no negative
// counts; consumed at least sampler_position * world_size) before the model,
// so a bad one leaves the model untouched; the file is only read, never changed.
std::optional<TrainingState> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                             torch::optim::Optimizer& optimizer);

}  // namespace chorus::torch_ext
