#include "comm/communicator/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace chorus::communicator {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kQueued: return "queued";
    case FlightRecorder::State::kRunning: return "running";
    case FlightRecorder::State::kCompleted: return "completed";
    case FlightRecorder::State::kFailed: return "failed";
  }
  return "?";
}

// Microseconds since the epoch of steady time `t`, given the system clock's offset from
// the steady clock; 0 for "not yet".
int64_t micros(FlightRecorder::Clock::time_point t, std::chrono::system_clock::duration offset) {
  if (t.time_since_epoch().count() == 0) return 0;
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch() + offset).count();
}

std::string safe_file_part(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '_';
  return out;
}

}  // namespace

std::string default_trace_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  return base + "/chorus-traces-" + std::to_string(getuid());
}

size_t FlightRecorder::queued(uint64_t seq, Collective what, DataType dtype, uint64_t count,
                              int root, Clock::time_point when) {
  return add(seq, what, dtype, count, root, when, State::kQueued);
}

size_t FlightRecorder::started(uint64_t seq, Collective what, DataType dtype, uint64_t count,
                               int root, Clock::time_point when) {
  return add(seq, what, dtype, count, root, when, State::kRunning);
}

void FlightRecorder::done_at_once(uint64_t seq, Collective what, DataType dtype, uint64_t count,
                                  int root, Clock::time_point when) {
  add(seq, what, dtype, count, root, when, State::kCompleted);
}

size_t FlightRecorder::add(uint64_t seq, Collective what, DataType dtype, uint64_t count, int root,
                           Clock::time_point when, State state) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t slot = next_id_++;
  Entry& e = at(slot);
  // Field by field: a fresh Entry assigned over it (a string and a vector moved in)
  // cost more than the rest of the record.
  e.id = slot + 1;
  e.seq = seq;
  e.what = what;
  e.dtype = dtype;
  e.count = count;
  e.root = root;
  e.state = state;
  e.queued_at = when;
  e.started_at = state != State::kQueued ? when : Clock::time_point{};
  e.ended_at = state == State::kCompleted ? when : Clock::time_point{};
  if (!e.error.empty()) e.error.clear();
  if (!e.awaiting.empty()) e.awaiting.clear();
  return slot;
}

void FlightRecorder::running(size_t slot, Clock::time_point when) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = at(slot);
  if (e.id != slot + 1) return;  // overwritten by newer operations
  e.state = State::kRunning;
  e.started_at = when;
}

void FlightRecorder::finished(size_t slot, const std::string& error,
                              const std::vector<int>& awaiting) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = at(slot);
  if (e.id != slot + 1) return;
  e.state = error.empty() ? State::kCompleted : State::kFailed;
  e.ended_at = Clock::now();
  e.error = error;
  e.awaiting = awaiting;
}

std::string FlightRecorder::json(int rank, int size, const std::string& host,
                                 const std::string& comm_id, const std::string& why) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream o;
  o << "{\"rank\":" << rank << ",\"size\":" << size << ",\"host\":" << quoted(host)
    << ",\"pid\":" << getpid() << ",\"communicator\":" << quoted(comm_id)
    << ",\"reason\":" << quoted(why) << ",\"operations\":[";
  bool first = true;
  const size_t n = entries_.size();
  const uint64_t oldest = next_id_ > n ? next_id_ - n : 0;
  for (uint64_t id = oldest; id < next_id_; ++id) {
    const Entry& e = entries_[id % n];
    if (e.id != id + 1) continue;
    o << (first ? "" : ",") << "\n {\"seq\":" << e.seq << ",\"kind\":\""
      << (is_p2p(e.what) ? "p2p" : "collective") << "\",\"op\":" << quoted(collective_name(e.what))
      << ",\"dtype\":" << quoted(dtype_name(e.dtype)) << ",\"count\":" << e.count
      << (is_p2p(e.what) ? ",\"peer\":" : ",\"root\":") << e.root
      << ",\"state\":\"" << state_name(e.state) << "\",\"queued_us\":" << micros(e.queued_at, system_offset_)
      << ",\"started_us\":" << micros(e.started_at, system_offset_)
      << ",\"ended_us\":" << micros(e.ended_at, system_offset_);
    if (!e.error.empty()) o << ",\"error\":" << quoted(e.error);
    if (!e.awaiting.empty()) {
      o << ",\"awaiting\":[";
      for (size_t i = 0; i < e.awaiting.size(); ++i) o << (i ? "," : "") << e.awaiting[i];
      o << "]";
    }
    o << "}";
    first = false;
  }
  o << "\n]}\n";
  return o.str();
}

uint64_t FlightRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_;
}

std::string FlightRecorder::summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t kept = std::min<uint64_t>(next_id_, entries_.size());
  std::ostringstream o;
  o << kept << (kept == 1 ? " operation" : " operations");
  if (kept > 0) {
    const Entry& last = entries_[(next_id_ - 1) % entries_.size()];
    o << ", the last " << collective_name(last.what) << " #" << last.seq << " ("
      << state_name(last.state) << ")";
  }
  return o.str();
}

std::string FlightRecorder::dump(const std::string& dir_in, int rank, int size,
                                 const std::string& host, const std::string& comm_id,
                                 const std::string& why) const {
  std::string text = json(rank, size, host, comm_id, why);
  const std::string dir = dir_in.empty() ? default_trace_dir() : dir_in;
  try {
    std::filesystem::create_directories(dir);
    std::string path = dir + "/chorus_trace_" + safe_file_part(comm_id) + "_rank" +
                       std::to_string(rank) + ".json";
    std::string tmp = path + ".tmp" + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text;
      if (!out.flush()) throw std::runtime_error("write failed");
    }
    std::filesystem::rename(tmp, path);
    return path;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[chorus flight recorder, rank %d] could not write to %s (%s)\n%s", rank,
                 dir.c_str(), e.what(), text.c_str());
    return "stderr";
  }
}

}  // namespace chorus::communicator
