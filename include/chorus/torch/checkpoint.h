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

#include <memory>
#include <optional>
#include <string>

#include "chorus/elastic.h"
#include "chorus/store.h"
#include "chorus/torch/process_group.h"

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

// The workers' side of chorusrun --join-at-checkpoint (chorus/elastic.h): whether the
// launcher asks this round's workers to stop at the checkpoint just saved, so that a
// joining node is admitted without losing steps. Use:
//
//   chorus::torch_ext::StopAtCheckpoint stop(group);
//   ... every N steps: save_checkpoint(...) on rank 0, then on every rank:
//   if (stop.requested()) return chorus::kStoppedAtCheckpointStatus;  // exit status
//
// Without the variable (not under an elastic chorusrun with the option) it is never
// requested and costs nothing. With it, rank 0 keeps a connection to the launchers'
// store, and requested() costs one store lookup on rank 0 and a one-element broadcast.
class StopAtCheckpoint {
 public:
  // Reads kStopAtCheckpointKeyVariable; with it, rank 0 connects to the launchers'
  // store (CHORUS_STORE_ADDR, CHORUS_STORE_PORT) and throws as TcpStore does when it
  // cannot.
  explicit StopAtCheckpoint(std::shared_ptr<ProcessGroup> group);
  bool enabled() const { return !key_.empty(); }
  // Collective: every rank calls it at the same point, after the checkpoint was saved
  // (rank 0's save precedes its lookup, so when any rank learns "stop" the checkpoint is
  // on disk). True on every rank or on none.
  bool requested();

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::string key_;
  std::shared_ptr<Store> store_;  // rank 0 only
};

}  // namespace chorus::torch_ext
