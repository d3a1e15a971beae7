// The flight recorder: each communicator keeps its last N operations (sequence number,
// collective, dtype, count, root (send/recv: the peer), state, enqueue/start/end times,
// and the error of a failed one) and writes them out when an operation times out, the
// communicator is aborted, or the process gets SIGTERM (stop_traces.h): to CHORUS_TRACE_DIR/chorus_trace_<comm>_rank<R>.json, or to
// default_trace_dir() when that is unset. The console gets one line per rank (summary()
// and the file's path, communicator.cc): a job of a few ranks that lost a node used to
// print hundreds of lines of JSON there. apps/chorus-trace merges the ranks' files and
// says which rank is behind and where, and which peers a timed-out operation was still
// waiting for. CHORUS_TRACE_BUFFER_SIZE sets N (0 turns it off).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/types.h"

namespace chorus::communicator {

// Where traces go when CHORUS_TRACE_DIR is unset: $TMPDIR (else /tmp) followed by
// /chorus-traces-<uid> (one per user: another user's directory is not writable).
std::string default_trace_dir();

class FlightRecorder {
 public:
  enum class State : uint8_t { kQueued, kRunning, kCompleted, kFailed };

  explicit FlightRecorder(size_t capacity)
      : entries_(capacity),
        system_offset_(std::chrono::system_clock::now().time_since_epoch() - Clock::now().time_since_epoch()) {}

  bool enabled() const { return !entries_.empty(); }
  using Clock = std::chrono::steady_clock;

  // Records a new operation, queued at `when`; returns its slot for the calls below.
  // The callers pass the times they read anyway (a clock reading costs some 25 ns here,
  // a tenth of a small collective's own time); the records are written out in the
  // system clock's time.
  size_t queued(uint64_t seq, Collective what, DataType dtype, uint64_t count, int root, Clock::time_point when);
  void running(size_t slot, Clock::time_point when);
  // queued() and running() at once, for an operation that starts as it is issued.
  size_t started(uint64_t seq, Collective what, DataType dtype, uint64_t count, int root, Clock::time_point when);
  // queued(), running() and completed() at once, for an operation that started and
  // completed as it was issued (the inline path), at `when` by the coarse clock: its
  // small operations' records are exact to the kernel's tick, a few milliseconds, and
  // may precede a queued operation's by as much.
  void done_at_once(uint64_t seq, Collective what, DataType dtype, uint64_t count, int root, Clock::time_point when);
  // `awaiting`: for an operation that timed out, the ranks it was still waiting for.
  void finished(size_t slot, const std::string& error, const std::vector<int>& awaiting = {});
  // The records, oldest first, as one JSON object with this rank's identity and `why`.
  std::string json(int rank, int size, const std::string& host, const std::string& comm_id,
                   const std::string& why) const;
  // How many operations were ever recorded.
  uint64_t recorded() const;
  // "12 operations, the last allreduce #57 (failed)": for the console.
  std::string summary() const;
  // Writes json() to `dir`/chorus_trace_<comm>_rank<R>.json (through a temporary file
  // and a rename), `dir` being default_trace_dir() when empty; to stderr when the file
  // cannot be written. Returns where it went; never throws.
  std::string dump(const std::string& dir, int rank, int size, const std::string& host,
                   const std::string& comm_id, const std::string& why) const;

 private:
  struct Entry {
    uint64_t id = 0;  // 0: unused; else 1 + position in recording order
    uint64_t seq = 0;
    Collective what = Collective::kBarrier;
    DataType dtype = DataType::kUInt8;
    uint64_t count = 0;
    int root = -1;  // send/recv: the peer, written as "peer"
    State state = State::kQueued;
    Clock::time_point queued_at, started_at, ended_at;
    std::string error;
    std::vector<int> awaiting;
  };
  Entry& at(size_t slot) { return entries_[slot % entries_.size()]; }
  size_t add(uint64_t seq, Collective what, DataType dtype, uint64_t count, int root, Clock::time_point when,
             State state);

  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t next_id_ = 0;
  // The system clock's time less the steady clock's, at construction: what turns the
  // records' steady times into times of day.
  std::chrono::system_clock::duration system_offset_;
};

}  // namespace chorus::communicator
