// chorus-mnist: the seed job. An MLP (784-512-512-10, seed 000) or a linear model
// (784->10 with Normalize(0.5, 0.5), seed 001) trained on Fashion-MNIST or MNIST with
// DistributedDataParallel over chorus; started by chorusrun (or alone as one rank).
//
// Output: rank 0 draws a progress bar when stdout is a terminal, else every rank
// prints the seed job's plain lines. --metrics FILE: rank 0 writes JSON lines there
// (see MetricsFile), which scripts/plot draws.
#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus/error.h"
#include "chorus/torch/checkpoint.h"
#include "chorus/torch/checksum.h"
#include "chorus/torch/data.h"
#include "chorus/torch/ddp.h"
#include "chorus/version.h"
#include "models.h"
#include "process_tuning.h"
#include "progress.h"

namespace {

using chorus::torch_ext::DistributedDataParallel;
using chorus::torch_ext::ProcessGroup;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "mlp";
  std::string dataset = "fashion";
  std::string data_dir;
  int64_t epochs = 5;
  int64_t batch_size = 512;  // global: split across ranks, as in seed 000
  double lr = 1e-3;
  double momentum = 0;
  uint64_t seed = 0;
  int64_t log_interval = 100;
  int64_t workers = 1;
  std::string checkpoint_dir;
  int64_t checkpoint_interval = 100;
  bool resume = false;
  std::string device = "cpu";
  int64_t max_steps = 0;  // 0: no limit (benchmarks and tests stop early with it)
  int64_t warmup_steps = 0;  // steps left out of samples_per_second (benchmarks)
  int threads = 0;        // 0: OMP_NUM_THREADS, else 1
  std::string metrics;    // rank 0 writes JSON lines here
  std::string sample_log;  // every rank appends the indices of each step here
  std::string malloc_thresholds;  // what keep_freed_memory() did (not an option)
};

// --metrics: one JSON object per line, written by rank 0 and flushed line by line, so
// that a crash leaves whole lines. Two kinds of line:
//   {"event":"train", "epoch", "step" (optimizer steps so far, all epochs), "loss" (of
//    rank 0's latest batch), "wall_time_s" (since training began), "steps" (steps since
//    the previous train line), "samples_per_second" (all ranks, over those steps'
//    wall time), and per-step means over them: "step_s" (forward, backward and
//    optimizer step), "allreduce_wait_s" (DDP's wait for its buckets' communication,
//    DdpStats::wait_seconds), "compute_s" (step_s - allreduce_wait_s), "backward_s"
//    (DdpStats::backward_seconds), and "buckets"}, at every --log-interval batch;
//   {"event":"epoch", "epoch", "step", "wall_time_s", "test_accuracy", "test_loss"} at
//    each epoch's end.
class MetricsFile {
 public:
  // Opens (truncates) `path`; "" when it could, else why not.
  std::string open(const std::string& path) {
    file_ = std::fopen(path.c_str(), "w");
    if (file_ == nullptr) return std::strerror(errno);
    return "";
  }
  ~MetricsFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  bool active() const { return file_ != nullptr; }
  void write(const nlohmann::json& line) {
    if (file_ == nullptr) return;
    std::fputs((line.dump() + "\n").c_str(), file_);
    std::fflush(file_);
  }

 private:
  std::FILE* file_ = nullptr;
};

// --sample-log: every rank appends one line per step, "epoch E step S rank R world W
// round N indices I,I,...", S counting optimizer steps over the whole run (1 for the
// first), N the launcher's round (CHORUS_RESTART_COUNT; 0 without it), which tells the
// lines of a round that lost steps from those of the one that redid them.
// A line is written as the step begins: a step that completed is logged by every rank,
// one that did not (past the checkpoint a restart resumes from) maybe by some. Each line
// is one write() to a file opened O_APPEND, so the ranks' lines never mix, and a resumed
// job adds to what the job before it wrote.
class SampleLog {
 public:
  // "" when `path` could be opened, else why not.
  std::string open(const std::string& path) {
    const char* round = std::getenv("CHORUS_RESTART_COUNT");
    round_ = round != nullptr && *round != '\0' ? round : "0";
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return fd_ < 0 ? std::strerror(errno) : "";
  }
  ~SampleLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  // The step's samples: order[from, from + count).
  void write(int64_t epoch, int64_t step, int rank, int world, const std::vector<int64_t>& order,
             int64_t from, int64_t count) {
    if (fd_ < 0) return;
    std::string line = "epoch " + std::to_string(epoch) + " step " + std::to_string(step) +
                       " rank " + std::to_string(rank) + " world " + std::to_string(world) +
                       " round " + round_ + " indices ";
    for (int64_t k = from; k < from + count; ++k) {
      line += std::to_string(order[k]);
      line += k + 1 < from + count ? ',' : '\n';
    }
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw chorus::SystemError(std::string("cannot write the --sample-log file: ") +
                                std::strerror(errno));
    }
  }

 private:
  int fd_ = -1;
  std::string round_;
};

// Why `state` (a checkpoint) cannot be continued with these arguments, or "". Its
// sampler must shuffle with the same seed, and its steps must have the same global
// batch, else the rest of the epoch would not be the rest of the same permutation.
// Checkpoints from before these were recorded (world_size 0) are not checked.
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

using chorus::mnist::Linear;
using chorus::mnist::Mlp;

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

std::shared_ptr<const chorus::data::MnistDataset> load_split(const Args& a, chorus::data::Split split) {
  chorus::data::MnistOptions o;
  o.directory = a.data_dir;
  o.split = split;
  o.layout = chorus::data::ImageLayout::kFlat;
  if (a.model == "linear") o.normalize = chorus::data::Normalize{0.5, 0.5};
  return chorus::data::MnistDataset::load(o);
}


struct TestResult {
  double accuracy = 0, avg_loss = 0;
};

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

// The datasets, both read first, so that a bad --data-dir fails before anything else.
struct Data {
  std::shared_ptr<const chorus::data::MnistDataset> train, test;
};

// Whether the global batch splits evenly across the ranks; says why not.
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

// <checkpoint-dir>/checkpoint.pt, or "" without --checkpoint-dir.
std::string checkpoint_path(const Args& a) {
  return a.checkpoint_dir.empty() ? "" : a.checkpoint_dir + "/checkpoint.pt";
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

// Rank 0 on a terminal draws a progress bar instead of the plain lines. Under
// chorusrun, stdout is a pipe to the launcher, which says whether its own stdout is a
// terminal (CHORUS_STDOUT_TERMINAL) and redraws lines ended by '\r' in place there.
bool draws_progress_bar(int rank, bool own_terminal) {
  const char* launcher_terminal = std::getenv("CHORUS_STDOUT_TERMINAL");
  return rank == 0 &&
         (own_terminal || (launcher_terminal != nullptr && std::string(launcher_terminal) == "1"));
}

// What the next metrics line averages over.
struct Interval {
  int64_t steps = 0, samples = 0;
  double step_s = 0, wait_s = 0, backward_s = 0;
  double wall_s = 0;   // the steps' wall time, data loading included, evaluation not
  size_t buckets = 0;  // of the latest step

  void add(double step_seconds, double wall_seconds, int64_t step_samples,
           const chorus::torch_ext::DdpStats& stats) {
    steps += 1;
    samples += step_samples;
    step_s += step_seconds;
    wall_s += wall_seconds;
    wait_s += stats.wait_seconds;
    backward_s += stats.backward_seconds;
    buckets = stats.buckets;
  }
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
          chorus::torch_ext::TrainingState& state, SampleLog& sample_log, MetricsFile& metrics)
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

  // The epochs from the state's on, then the report. 0, or kStoppedAtCheckpointStatus
  // where chorusrun asked to stop at a checkpoint.
  int run() {
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

  // The gradients live in the buckets: no copy into them before the allreduce and none
  // back after it (the same numbers as copying, bit for bit).
  static chorus::torch_ext::DdpOptions gradients_in_buckets() {
    chorus::torch_ext::DdpOptions o;
    o.gradient_as_bucket_view = true;
    return o;
  }

  // Epoch `number`'s steps, from where the run stands in it, up to its end, --max-steps
  // or a checkpoint that chorusrun asks to stop at.
  EpochEnd train_epoch(int64_t number) {
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
  std::vector<int64_t> begin_epoch(int64_t epoch) {
    if (!bar_) std::printf("curr epoch:  %lld\n", static_cast<long long>(epoch));
    sampler_.resume(epoch, epoch == resume_epoch_ ? resume_consumed_ : 0);
    state_.epoch = epoch;
    state_.sampler_position = sampler_.position();
    state_.consumed = sampler_.consumed();
    return sampler_.epoch_indices();
  }

  // One optimizer step on `b`, then what it adds to the run's counts. Returns its loss.
  torch::Tensor train_step(Epoch& e, const std::vector<int64_t>& order, const chorus::data::Batch& b) {
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
  void advance(Epoch& e, int64_t samples) {
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
  void log_step(const Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss) {
    const double loss_value = loss.item<double>();
    if (!bar_) {
      std::printf("loss: %7f [%5lld/%5lld]\n", loss_value, static_cast<long long>(e.step * b.size()),
                  static_cast<long long>(data_.train->size()));
      std::fflush(stdout);
    }
    if (metrics_.active()) write_train_metrics(e.number, loss_value);
  }

  void write_train_metrics(int64_t epoch, double loss) {
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
  void draw_progress(Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss) {
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

  chorus::mnist::Progress progress(const Epoch& e, const chorus::data::Batch& b, const torch::Tensor& loss,
                                   Clock::time_point now) const {
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
  bool stops_at_interval_checkpoint(const Epoch& e) {
    if (a_.checkpoint_interval <= 0 || state_.step % a_.checkpoint_interval != 0) return false;
    const bool run_ends = max_steps_reached() || (e.number + 1 == a_.epochs && e.step >= steps_per_epoch_);
    save();
    return !run_ends && stop_asked();
  }

  bool max_steps_reached() const { return a_.max_steps > 0 && state_.step >= a_.max_steps; }

  // After the epoch's steps: its checkpoint (not where --max-steps ended it), the
  // evaluation on the test set, and its lines.
  void finish_epoch(int64_t epoch, bool max_steps) {
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

  void save() {
    if (rank_ == 0 && !ckpt_.empty()) chorus::torch_ext::save_checkpoint(ckpt_, *model_, optimizer_, state_);
  }

  // chorusrun --join-at-checkpoint: after a checkpoint that does not end the run, every
  // rank asks whether to stop there for a joining node (chorus/elastic.h).
  bool stop_asked() {
    if (ckpt_.empty() || !at_checkpoint_.requested()) return false;
    if (rank_ == 0) {
      std::printf("stopping at the checkpoint of step %lld: chorusrun asked (a node joins)\n",
                  static_cast<long long>(state_.step));
    }
    std::fflush(stdout);
    return true;
  }

  // Every rank's parameter checksum, then rank 0's summary as a JSON line.
  void report() {
    std::printf("rank %d params %s\n", rank_,
                chorus::torch_ext::state_checksum(*model_, /*with_buffers=*/false).c_str());
    if (rank_ == 0) std::printf("%s\n", summary().dump().c_str());
    group_->barrier().wait();
  }

  nlohmann::json summary() const {
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

  double since_start() const { return std::chrono::duration<double>(Clock::now() - wall_start_).count(); }

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

int main(int argc, char** argv) {
  chorus::mnist::prefer_native_blas_kernels(argv);
  Args a;
  if (int rc = parse(argc, argv, a)) return rc < 0 ? 0 : rc;
  a.malloc_thresholds = chorus::mnist::keep_freed_memory();
  // Rank 0 (RANK, as chorusrun sets it; 0 when alone) opens the metrics file before
  // anything else, so that a bad path fails at once.
  MetricsFile metrics;
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
    auto group = ProcessGroup::from_env();
    // As in seed 000: the seed is set before the model is built, so every rank builds
    // the same initial weights (DDP's broadcast from rank 0 then changes nothing).
    torch::manual_seed(a.seed);
    if (a.model == "mlp") return train(a, Mlp(), group, metrics);
    return train(a, Linear(), group, metrics);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-mnist: %s\n", e.what());
    return 1;
  }
}
