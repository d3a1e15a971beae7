// One rank's training (trainer.h): the Trainer's epochs and steps, and the evaluation
// on the test set.
#include "trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "chorus/elastic.h"
#include "chorus/torch/checksum.h"
#include "process_tuning.h"

namespace chorus::mnist {
namespace {

template <class Model>
TestResult evaluate(Model& model, std::shared_ptr<const chorus::data::MnistDataset> test, int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  chorus::data::DataLoaderOptions lo;
  lo.batch_size = batch;
  chorus::data::DataLoader loader(test, lo);
  double loss = 0, correct = 0;
  int64_t batches = 0;
  while (auto b = loader.next()) {
    torch::Tensor out = model->forward(b->data);
    loss += torch::nn::functional::cross_entropy(out, b->target).template item<double>();
    correct += out.argmax(1).eq(b->target).sum().template item<double>();
    ++batches;
  }
  model->train();
  return {correct / static_cast<double>(test->size()), loss / static_cast<double>(batches)};
}

// Rank 0 on a terminal draws a progress bar instead of the plain lines. Under
// chorusrun, stdout is a pipe to the launcher, which says whether its own stdout is a
// terminal (CHORUS_STDOUT_TERMINAL) and redraws lines ended by '\r' in place there.
bool draws_progress_bar(int rank, bool own_terminal) {
  const char* launcher_terminal = std::getenv("CHORUS_STDOUT_TERMINAL");
  return rank == 0 &&
         (own_terminal || (launcher_terminal != nullptr && std::string(launcher_terminal) == "1"));
}

}  // namespace

void Interval::add(double step_seconds, double wall_seconds, int64_t step_samples,
                   const chorus::torch_ext::DdpStats& stats) {
  steps += 1;
  samples += step_samples;
  step_s += step_seconds;
  wall_s += wall_seconds;
  wait_s += stats.wait_seconds;
  backward_s += stats.backward_seconds;
  buckets = stats.buckets;
}

template <class Model>
Trainer<Model>::Trainer(const Args& a, Model model, std::shared_ptr<ProcessGroup> group, const Data& data,
                        torch::optim::Optimizer& optimizer, chorus::data::DistributedSampler& sampler,
                        chorus::torch_ext::TrainingState& state, SampleLog& sample_log,
                        MetricsFile& metrics)
    : a_(a), model_(model), group_(group), rank_(group->rank()), world_(group->size()), data_(data),
      optimizer_(optimizer), sampler_(sampler), state_(state), sample_log_(sample_log),
      metrics_(metrics), ckpt_(checkpoint_path(a)), batch_(a.batch_size / world_),
      resume_epoch_(state.epoch), resume_consumed_(state.consumed_by_all(world_)),
      ddp_(model.ptr(), group, gradients_in_buckets()), at_checkpoint_(group),
      wall_start_(Clock::now()), own_terminal_(::isatty(STDOUT_FILENO) == 1),
      bar_(draws_progress_bar(rank_, own_terminal_)),
      steps_per_epoch_(sampler.num_samples() / batch_) {
  state_.world_size = world_;
  state_.global_batch = a.batch_size;
  state_.sampler_seed = a.seed;
}

template <class Model>
int Trainer<Model>::run() {
  for (int64_t epoch = state_.epoch; epoch < a_.epochs; ++epoch) {
    const EpochEnd end = train_epoch(epoch);
    if (end == EpochEnd::kStopAtCheckpoint) return chorus::kStoppedAtCheckpointStatus;
    finish_epoch(epoch, end == EpochEnd::kMaxSteps);
    if (end == EpochEnd::kMaxSteps) break;
    // The epoch's checkpoint, saved before the evaluation.
    if (epoch + 1 < a_.epochs && stop_asked()) return chorus::kStoppedAtCheckpointStatus;
  }
  report();
  return 0;
}

// The gradients live in the buckets: no copy into them before the allreduce and none
// back after it (the same numbers as copying, bit for bit).
template <class Model>
chorus::torch_ext::DdpOptions Trainer<Model>::gradients_in_buckets() {
  chorus::torch_ext::DdpOptions o;
  o.gradient_as_bucket_view = true;
  return o;
}

// Epoch `number`'s steps, from where the run stands in it, up to its end, --max-steps
// or a checkpoint that chorusrun asks to stop at.
template <class Model>
auto Trainer<Model>::train_epoch(int64_t number) -> EpochEnd {
  const std::vector<int64_t> order = begin_epoch(number);
  chorus::data::DataLoaderOptions lo;
  lo.batch_size = batch_;
  lo.drop_last = true;
  lo.workers = a_.workers;
  chorus::data::DataLoader loader(data_.train, order, lo);
  Epoch e(number, sampler_.consumed() / a_.batch_size);
  EpochEnd end = EpochEnd::kDone;
  while (auto b = loader.next()) {
    const torch::Tensor loss = train_step(e, order, *b);
    if (e.step % a_.log_interval == 0) log_step(e, *b, loss);
    ++e.step;
    if (bar_) draw_progress(e, *b, loss);
    if (stops_at_interval_checkpoint(e)) return EpochEnd::kStopAtCheckpoint;
    if (max_steps_reached()) {
      end = EpochEnd::kMaxSteps;
      break;
    }
  }
  train_seconds_ += std::chrono::duration<double>(Clock::now() - e.timed_from).count();
  if (bar_) std::printf("\n");  // the bar's line stays, finished
  return end;
}

// The epoch's line (without the bar), the sampler and the state at its start: the
// rest of the epoch after what all ranks consumed before, at whatever world size they
// were (the first `consumed` positions of the epoch's permutation). Returns this
// rank's samples of the epoch, in order.
template <class Model>
std::vector<int64_t> Trainer<Model>::begin_epoch(int64_t epoch) {
  if (!bar_) std::printf("curr epoch:  %lld\n", static_cast<long long>(epoch));
  sampler_.resume(epoch, epoch == resume_epoch_ ? resume_consumed_ : 0);
  state_.epoch = epoch;
  state_.sampler_position = sampler_.position();
  state_.consumed = sampler_.consumed();
  return sampler_.epoch_indices();
}

// One optimizer step on `b`, then what it adds to the run's counts. Returns its loss.
template <class Model>
torch::Tensor Trainer<Model>::train_step(Epoch& e, const std::vector<int64_t>& order,
                                         const chorus::data::Batch& b) {
  const auto step_start = Clock::now();
  // Logged before the step: a rank killed once its gradients were allreduced would
  // otherwise leave no line for a step the others completed and checkpointed.
  sample_log_.write(e.number, state_.step + 1, rank_, world_, order, sampler_.position(), b.size());
  torch::Tensor loss = torch::nn::functional::cross_entropy(ddp_.forward(model_, b.data), b.target);
  optimizer_.zero_grad();
  loss.backward();
  optimizer_.step();
  const auto step_end = Clock::now();
  interval_.add(std::chrono::duration<double>(step_end - step_start).count(),
                std::chrono::duration<double>(step_end - e.tick).count(), b.size() * world_,
                ddp_.last_step_stats());
  e.tick = step_end;
  advance(e, b.size());
  return loss;
}

// The sampler, the state and the timed samples past a step of `samples`.
template <class Model>
void Trainer<Model>::advance(Epoch& e, int64_t samples) {
  sampler_.advance(samples);
  ++state_.step;
  if (state_.step <= a_.warmup_steps) {
    e.timed_from = Clock::now();  // the timed part begins after the warm-up steps
  } else {
    trained_ += samples * world_;
  }
  state_.sampler_position = sampler_.position();
  state_.consumed = sampler_.consumed();
}

// Every --log-interval steps: the loss line (where no bar is drawn) and a train line
// of metrics.
template <class Model>
void Trainer<Model>::log_step(const Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss) {
  const double loss_value = loss.item<double>();
  if (!bar_) {
    std::printf("loss: %7f [%5lld/%5lld]\n", loss_value, static_cast<long long>(e.step * b.size()),
                static_cast<long long>(data_.train->size()));
    std::fflush(stdout);
  }
  if (metrics_.active()) write_train_metrics(e.number, loss_value);
}

template <class Model>
void Trainer<Model>::write_train_metrics(int64_t epoch, double loss) {
  const double n = static_cast<double>(interval_.steps);
  const double wall = interval_.wall_s;
  metrics_.write({{"event", "train"},
                  {"epoch", epoch},
                  {"step", state_.step},
                  {"loss", loss},
                  {"wall_time_s", since_start()},
                  {"steps", interval_.steps},
                  {"samples_per_second", wall > 0 ? interval_.samples / wall : 0.0},
                  {"step_s", interval_.step_s / n},
                  {"compute_s", (interval_.step_s - interval_.wait_s) / n},
                  {"allreduce_wait_s", interval_.wait_s / n},
                  {"backward_s", interval_.backward_s / n},
                  {"buckets", interval_.buckets}});
  interval_ = Interval{};
}

// Redrawn at most 10 times a second, and at the epoch's (or the run's) last step.
template <class Model>
void Trainer<Model>::draw_progress(Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss) {
  const auto now = Clock::now();
  const bool last = e.step >= steps_per_epoch_ || max_steps_reached();
  if (now - e.last_drawn < std::chrono::milliseconds(100) && !last) return;
  e.last_drawn = now;
  // The line ended by '\r' (a status line to chorusrun); on a terminal of its own,
  // the rest of a longer previous line is cleared too.
  std::printf("%s%s\r", chorus::mnist::render_progress(progress(e, b, loss, now)).c_str(),
              own_terminal_ ? "\x1b[K" : "");
  std::fflush(stdout);
}

template <class Model>
chorus::mnist::Progress Trainer<Model>::progress(const Epoch& e, const chorus::data::Batch& b,
                                                 const torch::Tensor& loss, Clock::time_point now) const {
  const double elapsed = std::chrono::duration<double>(now - e.began).count();
  const int64_t done = e.step - e.first_step;
  int64_t left = (steps_per_epoch_ - e.step) + (a_.epochs - e.number - 1) * steps_per_epoch_;
  if (a_.max_steps > 0) left = std::min(left, a_.max_steps - state_.step);
  chorus::mnist::Progress p;
  p.epoch = e.number;
  p.epochs = a_.epochs;
  p.step = e.step;
  p.steps = steps_per_epoch_;
  p.loss = loss.item<double>();
  p.samples_per_second = elapsed > 0 ? done * b.size() * world_ / elapsed : 0;
  p.eta_seconds = done > 0 ? elapsed / done * std::max<int64_t>(left, 0) : -1;
  return p;
}

// Every --checkpoint-interval steps: the checkpoint, then whether chorusrun asks to
// stop there (never at the run's last step, which ends it anyway).
template <class Model>
bool Trainer<Model>::stops_at_interval_checkpoint(const Epoch& e) {
  if (a_.checkpoint_interval <= 0 || state_.step % a_.checkpoint_interval != 0) return false;
  const bool run_ends = max_steps_reached() || (e.number + 1 == a_.epochs && e.step >= steps_per_epoch_);
  save();
  return !run_ends && stop_asked();
}

template <class Model>
bool Trainer<Model>::max_steps_reached() const {
  return a_.max_steps > 0 && state_.step >= a_.max_steps;
}

// After the epoch's steps: its checkpoint (not where --max-steps ended it), the
// evaluation on the test set, and its lines.
template <class Model>
void Trainer<Model>::finish_epoch(int64_t epoch, bool max_steps) {
  if (!max_steps) {
    state_.epoch = epoch + 1;
    state_.sampler_position = 0;
    state_.consumed = 0;
    save();
  }
  last_ = evaluate(model_, data_.test, 1000);
  metrics_.write({{"event", "epoch"},
                  {"epoch", epoch},
                  {"step", state_.step},
                  {"wall_time_s", since_start()},
                  {"test_accuracy", last_.accuracy},
                  {"test_loss", last_.avg_loss}});
  if (rank_ == 0) {
    std::printf("Test Error: \n Accuracy: %.1f%%, Avg loss: %8f \n\n", 100 * last_.accuracy,
                last_.avg_loss);
  }
  std::fflush(stdout);
}

template <class Model>
void Trainer<Model>::save() {
  if (rank_ == 0 && !ckpt_.empty()) chorus::torch_ext::save_checkpoint(ckpt_, *model_, optimizer_, state_);
}

// chorusrun --join-at-checkpoint: after a checkpoint that does not end the run, every
// rank asks whether to stop there for a joining node (chorus/elastic.h).
template <class Model>
bool Trainer<Model>::stop_asked() {
  if (ckpt_.empty() || !at_checkpoint_.requested()) return false;
  if (rank_ == 0) {
    std::printf("stopping at the checkpoint of step %lld: chorusrun asked (a node joins)\n",
                static_cast<long long>(state_.step));
  }
  std::fflush(stdout);
  return true;
}

// Every rank's parameter checksum, then rank 0's summary as a JSON line.
template <class Model>
void Trainer<Model>::report() {
  std::printf("rank %d params %s\n", rank_,
              chorus::torch_ext::state_checksum(*model_, /*with_buffers=*/false).c_str());
  if (rank_ == 0) std::printf("%s\n", summary().dump().c_str());
  group_->barrier().wait();
}

template <class Model>
nlohmann::json Trainer<Model>::summary() const {
  return {{"epochs", a_.epochs},
          {"ranks", world_},
          {"steps", state_.step},
          {"samples_per_second", train_seconds_ > 0 ? trained_ / train_seconds_ : 0.0},
          {"train_seconds", train_seconds_},
          {"wall_time_s", since_start()},
          {"test_accuracy", last_.accuracy},
          {"test_loss", last_.avg_loss},
          {"blas", chorus::mnist::openblas_core()},
          {"shared_buckets", ddp_.buckets_in_shared_memory()},
          {"malloc_thresholds", a_.malloc_thresholds}};
}

template <class Model>
double Trainer<Model>::since_start() const {
  return std::chrono::duration<double>(Clock::now() - wall_start_).count();
}

template class Trainer<Mlp>;
template class Trainer<Linear>;

}  // namespace chorus::mnist
