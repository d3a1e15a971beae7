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
};

void save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state);

// Loads a checkpoint written by save_checkpoint into `model` and `optimizer`. Returns
// nullopt when `path` does not exist.
std::optional<TrainingState> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                             torch::optim::Optimizer& optimizer);

}  // namespace chorus::torch_ext
