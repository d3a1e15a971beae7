// chorus-trace: reads the flight-recorder files that the ranks of a job wrote on a
// timeout or abort (CHORUS_TRACE_DIR/chorus_trace_<comm>_rank<R>.json), and says, per
// communicator, how far every rank got, which rank is behind, and in what operation
// each rank was stuck.
//
// Usage: chorus-trace [--timeline-data FILE] PATH...
//   PATH: files, or directories searched for chorus_trace_*.json
//   --timeline-data FILE: also writes every operation of every rank as one line of a
//   tab-separated table (times in ms), which `scripts/plot trace FILE` draws as a
//   timeline with the operation each rank is stuck in marked (see write_timeline).
// Exit status: 0 when the files were read, 1 on unreadable or malformed input or an
// unwritable FILE, 2 on a bad command line.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "chorus/version.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RankTrace {
  int rank = 0, size = 0;
  std::string host, reason;
  int64_t last_completed = -1;  // highest collective seq completed
  std::string last_completed_op;
  json stuck;  // first collective not completed, or null
  json collectives = json::array();
  json operations = json::array();  // every operation, p2p too (the timeline)
  int64_t first_failure_us = INT64_MAX;  // when this rank's first operation failed
};

// Highest collective sequence number `t` had issued by `when` (microseconds), -1: none.
int64_t issued_by(const RankTrace& t, int64_t when) {
  int64_t seq = -1;
  for (const json& op : t.collectives) {
    if (op.at("queued_us").get<int64_t>() <= when) seq = std::max(seq, op.at("seq").get<int64_t>());
  }
  return seq;
}

std::vector<fs::path> trace_files(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p)) {
        std::string name = e.path().filename().string();
        if (name.rfind("chorus_trace_", 0) == 0 && e.path().extension() == ".json") {
          files.push_back(e.path());
        }
      }
    } else if (fs::exists(p)) {
      files.emplace_back(p);
    } else {
      throw std::runtime_error("no such file or directory: " + p);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error("no chorus_trace_*.json files found");
  return files;
}

RankTrace summarize(const json& doc) {
  RankTrace t;
  t.rank = doc.at("rank").get<int>();
  t.size = doc.at("size").get<int>();
  t.host = doc.at("host").get<std::string>();
  t.reason = doc.at("reason").get<std::string>();
  for (const json& op : doc.at("operations")) {
    for (const char* key : {"seq", "kind", "op", "state", "queued_us", "started_us", "ended_us"}) (void)op.at(key);
    t.operations.push_back(op);
    if (op.at("kind") != "collective") continue;
    t.collectives.push_back(op);
    if (op.at("state") == "failed") {
      t.first_failure_us = std::min(t.first_failure_us, op.at("ended_us").get<int64_t>());
    }
    int64_t seq = op.at("seq").get<int64_t>();
    if (op.at("state") == "completed") {
      if (seq > t.last_completed) {
        t.last_completed = seq;
        t.last_completed_op = op.at("op").get<std::string>();
      }
    } else if (t.stuck.is_null()) {
      t.stuck = op;
    }
  }
  return t;
}

std::string describe(const json& op) {
  std::string s = op.at("op").get<std::string>() + " #" + std::to_string(op.at("seq").get<int64_t>()) +
                  " (" + op.at("dtype").get<std::string>() + ", count " +
                  std::to_string(op.at("count").get<uint64_t>()) + ", " +
                  op.at("state").get<std::string>() + ")";
  if (op.contains("awaiting")) {
    s += ", waiting for rank";
    if (op.at("awaiting").size() > 1) s += "s";
    for (const json& r : op.at("awaiting")) s += " " + std::to_string(r.get<int>());
  }
  if (op.contains("error")) s += ": " + op.at("error").get<std::string>();
  return s;
}

// The ranks behind: what each rank had called when the first operation failed; a rank
// that had not yet called what the others were waiting in is behind. Sets *lowest and
// *highest to the lowest and highest collective issued by then; none when they agree.
std::vector<int> ranks_behind(const std::map<int, RankTrace>& ranks, int64_t* lowest, int64_t* highest) {
  int64_t failed_at = INT64_MAX;
  for (const auto& [r, t] : ranks) failed_at = std::min(failed_at, t.first_failure_us);
  *lowest = INT64_MAX;
  *highest = -1;
  for (const auto& [r, t] : ranks) {
    int64_t issued = issued_by(t, failed_at);
    *lowest = std::min(*lowest, issued);
    *highest = std::max(*highest, issued);
  }
  std::vector<int> behind;
  if (*lowest == *highest) return behind;
  for (const auto& [r, t] : ranks) {
    if (issued_by(t, failed_at) == *lowest) behind.push_back(r);
  }
  return behind;
}

void report(const std::string& comm, std::map<int, RankTrace>& ranks) {
  const int size = ranks.begin()->second.size;
  std::printf("communicator '%s': %d of %d ranks wrote a trace\n", comm.c_str(),
              static_cast<int>(ranks.size()), size);
  // Who was waiting for whom: a rank without a trace (dead, stopped, or never failing)
  // that the others were waiting for is where to look first.
  std::map<int, std::vector<int>> awaited_by;
  for (auto& [r, t] : ranks) {
    if (t.stuck.is_null() || !t.stuck.contains("awaiting")) continue;
    for (const json& peer : t.stuck.at("awaiting")) awaited_by[peer.get<int>()].push_back(r);
  }
  for (int r = 0; r < size; ++r) {
    if (ranks.count(r) != 0) continue;
    std::printf("  rank %d: no trace (the process died or is stopped, or it never failed)", r);
    if (awaited_by.count(r) != 0) {
      std::printf("; ranks");
      for (int w : awaited_by[r]) std::printf(" %d", w);
      std::printf(" were waiting for it");
    }
    std::printf("\n");
  }
  for (auto& [r, t] : ranks) {
    std::printf("  rank %d (host %s): last completed collective %s; ", r, t.host.c_str(),
                t.last_completed < 0 ? "none" : ("#" + std::to_string(t.last_completed) + " " + t.last_completed_op).c_str());
    if (t.stuck.is_null()) std::printf("no collective pending\n");
    else std::printf("then %s\n", describe(t.stuck).c_str());
  }
  int64_t lowest = 0, highest = 0;
  const std::vector<int> behind = ranks_behind(ranks, &lowest, &highest);
  if (behind.empty()) {
    std::printf("  every rank that wrote a trace had called collective #%lld when the first "
                "failure happened; look at the ranks without a trace\n",
                static_cast<long long>(highest));
    return;
  }
  for (int r : behind) {
    std::printf("  BEHIND: rank %d (host %s) had called only up to collective #%lld when the "
                "first operation failed, while others had called #%lld\n",
                r, ranks.at(r).host.c_str(), static_cast<long long>(lowest),
                static_cast<long long>(highest));
  }
}

// The timeline table (--timeline-data), for every communicator: a header of comment
// lines ("# communicator NAME", "# ranks SIZE", "# no-trace RANK" for each rank
// without a trace, "# behind RANK" for each rank report() calls BEHIND), then one line
// per operation, tab-separated:
//   communicator rank seq kind op state start_ms end_ms stuck label
// start_ms: when the rank called it (queued); end_ms: when it completed or failed, or
// for an operation still queued or running, the latest time in the communicator's
// traces (when the last of them was written, about). Both in ms since the
// communicator's earliest call, on the hosts' system clocks. stuck: 1 for the
// collective report() names as each rank's pending one, else 0. label: "op #seq".
void write_timeline(std::FILE* out, const std::string& comm, const std::map<int, RankTrace>& ranks) {
  const int size = ranks.begin()->second.size;
  int64_t first = INT64_MAX, last = 0;
  for (const auto& [r, t] : ranks) {
    for (const json& op : t.operations) {
      for (const char* key : {"queued_us", "started_us", "ended_us"}) {
        const int64_t us = op.at(key).get<int64_t>();
        if (us == 0) continue;  // not yet
        first = std::min(first, us);
        last = std::max(last, us);
      }
    }
  }
  std::fprintf(out, "# chorus-trace timeline: times in ms since the first call\n");
  std::fprintf(out, "# communicator %s\n# ranks %d\n", comm.c_str(), size);
  for (int r = 0; r < size; ++r) {
    if (ranks.count(r) == 0) std::fprintf(out, "# no-trace %d\n", r);
  }
  int64_t lowest = 0, highest = 0;
  for (int r : ranks_behind(ranks, &lowest, &highest)) std::fprintf(out, "# behind %d\n", r);
  std::fprintf(out, "# communicator\trank\tseq\tkind\top\tstate\tstart_ms\tend_ms\tstuck\tlabel\n");
  auto ms = [&](int64_t us) { return static_cast<double>(us - first) / 1000.0; };
  for (const auto& [r, t] : ranks) {
    for (const json& op : t.operations) {
      const int64_t queued = op.at("queued_us").get<int64_t>();
      const int64_t ended = op.at("ended_us").get<int64_t>();
      const int64_t seq = op.at("seq").get<int64_t>();
      const bool stuck = !t.stuck.is_null() && op.at("kind") == "collective" && t.stuck.at("seq") == seq;
      const std::string name = op.at("op").get<std::string>();
      std::fprintf(out, "%s\t%d\t%lld\t%s\t%s\t%s\t%.3f\t%.3f\t%d\t%s #%lld\n", comm.c_str(), r,
                   static_cast<long long>(seq), op.at("kind").get<std::string>().c_str(), name.c_str(),
                   op.at("state").get<std::string>().c_str(), ms(queued), ms(ended != 0 ? ended : last),
                   stuck ? 1 : 0, name.c_str(), static_cast<long long>(seq));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-trace: merge the flight-recorder files of a job's ranks"};
  std::vector<std::string> paths;
  std::string timeline;
  app.add_option("paths", paths, "trace files or directories")->required();
  app.add_option("--timeline-data", timeline,
                 "also write every rank's operations as a table (ms) for `scripts/plot trace`");
  app.set_version_flag("--version", std::string("chorus-trace ") + CHORUS_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    std::map<std::string, std::map<int, RankTrace>> comms;
    for (const fs::path& file : trace_files(paths)) {
      std::ifstream in(file);
      json doc;
      try {
        doc = json::parse(in);
        RankTrace t = summarize(doc);
        comms[doc.at("communicator").get<std::string>()][t.rank] = t;
      } catch (const json::exception& e) {
        throw std::runtime_error(file.string() + " is not a chorus trace: " + e.what());
      }
    }
    for (auto& [comm, ranks] : comms) report(comm, ranks);
    if (!timeline.empty()) {
      std::FILE* out = std::fopen(timeline.c_str(), "w");
      if (out == nullptr) {
        throw std::runtime_error("cannot write the --timeline-data file " + timeline + ": " +
                                 std::strerror(errno));
      }
      for (auto& [comm, ranks] : comms) write_timeline(out, comm, ranks);
      if (std::fclose(out) != 0) throw std::runtime_error("writing " + timeline + " failed");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
