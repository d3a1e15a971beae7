// chorus-mnist jobs for tests: standalone chorusrun of N workers, a tiny MNIST-shaped
// data set, and the parameter checksums the workers print.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "util/chorusrun.h"
#include "util/ranks.h"

namespace chorus::mnist_job {

using chorus::test::Subprocess;

inline const std::string kRun = std::string(CHORUS_BIN_DIR) + "/chorusrun";
inline const std::string kMnist = std::string(CHORUS_BIN_DIR) + "/chorus-mnist";
inline const std::string kFashion = "/usr/share/datasets/fashion-mnist";

// chorusrun with `launcher_args`, in an environment without a job's rendezvous variables.
inline chorus::test::SpawnOptions launcher_options(std::vector<std::string> launcher_args) {
  chorus::test::SpawnOptions o;
  o.args = std::move(launcher_args);
  o.env = {{"OMP_NUM_THREADS", "1"}, {"CHORUS_CONNECT_TIMEOUT", "60"}};
  o.unset_env = chorus::test::launcher_unset_env();
  return o;
}

// A standalone chorusrun of `ranks` chorus-mnist workers with `args`.
inline chorus::test::SpawnOptions job_options(int ranks, const std::vector<std::string>& args,
                                              const std::vector<std::string>& launcher_args = {}) {
  chorus::test::SpawnOptions o =
      launcher_options({"--standalone", "--nproc-per-node", std::to_string(ranks), "--tee", "3"});
  o.args.insert(o.args.end(), launcher_args.begin(), launcher_args.end());
  o.args.push_back(kMnist);
  o.args.insert(o.args.end(), args.begin(), args.end());
  return o;
}

inline std::unique_ptr<Subprocess> job(int ranks, const std::vector<std::string>& args,
                                       const std::vector<std::string>& launcher_args = {}) {
  return std::make_unique<Subprocess>(kRun, job_options(ranks, args, launcher_args));
}

// "rank R params HASH" lines by rank.
inline std::map<int, std::string> params_by_rank(const std::string& out) {
  std::map<int, std::string> m;
  std::regex re("rank ([0-9]+) params ([0-9a-f]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    m[std::stoi((*it)[1])] = (*it)[2];
  }
  return m;
}

inline void put_be32(std::ofstream& f, uint32_t v) {
  unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                        static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  f.write(reinterpret_cast<char*>(b), 4);
}

// A small MNIST-shaped data set (raw IDX files) in a fresh directory.
inline std::string make_tiny_dataset(int train, int test) {
  std::string dir = testing::TempDir() + "tiny_mnist_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::mt19937 rng(5);
  auto write = [&](const std::string& prefix, int n) {
    std::ofstream img(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
    put_be32(img, 2051);
    put_be32(img, n);
    put_be32(img, 28);
    put_be32(img, 28);
    std::ofstream lab(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
    put_be32(lab, 2049);
    put_be32(lab, n);
    for (int i = 0; i < n; ++i) {
      int label = static_cast<int>(rng() % 10);
      lab.put(static_cast<char>(label));
      for (int p = 0; p < 784; ++p) img.put(static_cast<char>((p % 10 == label ? 200 : 0) + rng() % 50));
    }
  };
  write("train", train);
  write("t10k", test);
  return dir;
}

// One line of chorus-mnist's --sample-log: the indices a rank used in one step.
struct LogLine {
  int64_t epoch, step, rank, world, round;
  std::vector<int64_t> indices;
};

// The sample log's lines, in the order they were appended. `finished`: the job has
// ended, so every line must be whole (a test failure names one that is not); otherwise
// a line that does not match, such as the one being written, is skipped.
inline std::vector<LogLine> read_sample_log(const std::string& path, bool finished) {
  std::vector<LogLine> lines;
  std::ifstream in(path);
  const std::regex re(
      "epoch ([0-9]+) step ([0-9]+) rank ([0-9]+) world ([0-9]+) round ([0-9]+) indices ([0-9,]+)");
  for (std::string text; std::getline(in, text);) {
    std::smatch m;
    const bool whole = std::regex_match(text, m, re);
    if (finished) {
      EXPECT_TRUE(whole) << "a malformed sample log line: " << text;
    }
    if (!whole) continue;
    LogLine line{std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5]), {}};
    std::stringstream list(m[6]);
    for (std::string index; std::getline(list, index, ',');) line.indices.push_back(std::stoll(index));
    lines.push_back(line);
  }
  return lines;
}

}  // namespace chorus::mnist_job
