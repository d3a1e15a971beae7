// One rank's training once main.cc's train() has set it up (Trainer): its epochs and
// steps under DistributedDataParallel, what they print (the seed job's plain lines or
// rank 0's progress bar, progress.h), write (outputs.h), their checkpoints, the
// evaluation on the test set after each epoch, and the report at the end. Trainer is
// built for the two models of models.h, Mlp and Linear (trainer.cc).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "chorus/torch/checkpoint.h"
#include "chorus/torch/data.h"
#include "chorus/torch/ddp.h"
#include "models.h"
#include "outputs.h"
#include "progress.h"

namespace chorus::mnist {

using chorus::torch_ext::DistributedDataParallel;
using chorus::torch_ext::ProcessGroup;
using Clock = std::chrono::steady_clock;

// The datasets, both read first, so that a bad --data-dir fails before anything else.
struct Data {
  std::shared_ptr<const chorus::data::MnistDataset> train, test;
};

struct TestResult {
  double accuracy = 0, avg_loss = 0;
};

// What the next metrics line averages over.
struct Interval {
  int64_t steps = 0, samples = 0;
  double step_s = 0, wait_s = 0, backward_s = 0;
  double wall_s = 0;   // the steps' wall time, data loading included, evaluation not
  size_t buckets = 0;  // of the latest step

  void add(double step_seconds, double wall_seconds, int64_t step_samples,
           const chorus::torch_ext::DdpStats& stats);
};

// One rank's training once train() has set it up: the model under
// DistributedDataParallel, its epochs and steps, what they print, write and draw, their
// checkpoints, and the report at the end. What it is given is train()'s and outlives
// it.
template <class Model>
class Trainer {
 public:
  Trainer(const Args& a, Model model, std::shared_ptr<ProcessGroup> group, const Data& data,
          torch::optim::Optimizer& optimizer, chorus::data::DistributedSampler& sampler,
          chorus::torch_ext::TrainingState& state, SampleLog& sample_log, MetricsFile& metrics);

  // The epochs from the state's on, then the report. 0, or kStoppedAtCheckpointStatus
  // where chorusrun asked to stop at a checkpoint.
  int run();

 private:
  enum class EpochEnd { kDone, kMaxSteps, kStopAtCheckpoint };

  // The epoch in progress, as its steps and the progress bar see it.
  struct Epoch {
    Epoch(int64_t number, int64_t step) : number(number), step(step), first_step(step) {}
    const int64_t number;
    int64_t step;              // within the epoch
    const int64_t first_step;  // where this run began the epoch
    Clock::time_point timed_from = Clock::now();  // the timed part, after the warm-up steps
    const Clock::time_point began = Clock::now();
    Clock::time_point last_drawn{};         // by the progress bar
    Clock::time_point tick = Clock::now();  // the end of the previous step
  };

  static chorus::torch_ext::DdpOptions gradients_in_buckets();
  EpochEnd train_epoch(int64_t number);
  std::vector<int64_t> begin_epoch(int64_t epoch);
  torch::Tensor train_step(Epoch& e, const std::vector<int64_t>& order, const chorus::data::Batch& b);
  void advance(Epoch& e, int64_t samples);
  void log_step(const Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss);
  void write_train_metrics(int64_t epoch, double loss);
  void draw_progress(Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss);
  Progress progress(const Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss,
                    Clock::time_point now) const;
  bool stops_at_interval_checkpoint(const Epoch& e);
  bool max_steps_reached() const;
  void finish_epoch(int64_t epoch, bool max_steps);
  void save();
  bool stop_asked();
  void report();
  nlohmann::json summary() const;
  double since_start() const;

  const Args& a_;
  Model model_;
  std::shared_ptr<ProcessGroup> group_;
  const int rank_, world_;
  const Data& data_;
  torch::optim::Optimizer& optimizer_;
  chorus::data::DistributedSampler& sampler_;
  chorus::torch_ext::TrainingState& state_;
  SampleLog& sample_log_;
  MetricsFile& metrics_;
  const std::string ckpt_;
  const int64_t batch_;  // this rank's share of the global batch
  // Where the run began: the epoch, and the samples of it that all ranks had consumed.
  const int64_t resume_epoch_, resume_consumed_;
  DistributedDataParallel ddp_;
  chorus::torch_ext::StopAtCheckpoint at_checkpoint_;
  const Clock::time_point wall_start_;
  const bool own_terminal_, bar_;
  const int64_t steps_per_epoch_;
  int64_t trained_ = 0;  // samples of the timed steps, all ranks
  double train_seconds_ = 0;
  TestResult last_;      // the latest evaluation
  Interval interval_;
};

extern template class Trainer<Mlp>;
extern template class Trainer<Linear>;

}  // namespace chorus::mnist
