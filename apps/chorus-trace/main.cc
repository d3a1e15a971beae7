// chorus-trace: reads the flight-recorder files that the ranks of a job wrote on a
// timeout or abort (CHORUS_TRACE_DIR/chorus_trace_<comm>_rank<R>.json), and says, per
// communicator, how far every rank got, which rank is behind, and in what operation
// each rank was stuck.
//
// Usage: chorus-trace PATH...   (files, or directories searched for chorus_trace_*.json)
// Exit status: 0 when the files were read, 1 on unreadable or malformed input, 2 on a
// bad command line.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
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
  int64_t failed_at = INT64_MAX;
  for (auto& [r, t] : ranks) {
    failed_at = std::min(failed_at, t.first_failure_us);
    std::printf("  rank %d (host %s): last completed collective %s; ", r, t.host.c_str(),
                t.last_completed < 0 ? "none" : ("#" + std::to_string(t.last_completed) + " " + t.last_completed_op).c_str());
    if (t.stuck.is_null()) std::printf("no collective pending\n");
    else std::printf("then %s\n", describe(t.stuck).c_str());
  }
  // What each rank had called when the first operation failed: a rank that had not yet
  // called what the others were waiting in is the one behind.
  int64_t lowest = INT64_MAX, highest = -1;
  for (auto& [r, t] : ranks) {
    int64_t issued = issued_by(t, failed_at);
    lowest = std::min(lowest, issued);
    highest = std::max(highest, issued);
  }
  if (lowest == highest) {
    std::printf("  every rank that wrote a trace had called collective #%lld when the first "
                "failure happened; look at the ranks without a trace\n",
                static_cast<long long>(highest));
    return;
  }
  for (auto& [r, t] : ranks) {
    int64_t issued = issued_by(t, failed_at);
    if (issued != lowest) continue;
    std::printf("  BEHIND: rank %d (host %s) had called only up to collective #%lld when the "
                "first operation failed, while others had called #%lld\n",
                r, t.host.c_str(), static_cast<long long>(issued), static_cast<long long>(highest));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-trace: merge the flight-recorder files of a job's ranks"};
  std::vector<std::string> paths;
  app.add_option("paths", paths, "trace files or directories")->required();
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
