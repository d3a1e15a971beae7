// chorus-mnist's files besides stdout: rank 0's --metrics JSON lines (MetricsFile) and
// every rank's --sample-log lines (SampleLog). Each is opened by open(), which returns
// "" or why it could not be, and closed by its destructor; write() does nothing while
// it is not open.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace chorus::mnist {

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
  std::string open(const std::string& path);
  ~MetricsFile();
  bool active() const { return file_ != nullptr; }
  void write(const nlohmann::json& line);

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
  std::string open(const std::string& path);
  ~SampleLog();
  // The step's samples: order[from, from + count). Throws chorus::SystemError where the
  // line could not be written whole.
  void write(int64_t epoch, int64_t step, int rank, int world, const std::vector<int64_t>& order,
             int64_t from, int64_t count);

 private:
  int fd_ = -1;
  std::string round_;
};

}  // namespace chorus::mnist
