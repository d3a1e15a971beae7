// chorus-mnist's --metrics and --sample-log files (outputs.h).
#include "outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "chorus/error.h"

namespace chorus::mnist {

std::string MetricsFile::open(const std::string& path) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) return std::strerror(errno);
  return "";
}

MetricsFile::~MetricsFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsFile::write(const nlohmann::json& line) {
  if (file_ == nullptr) return;
  std::fputs((line.dump() + "\n").c_str(), file_);
  std::fflush(file_);
}

std::string SampleLog::open(const std::string& path) {
  const char* round = std::getenv("CHORUS_RESTART_COUNT");
  round_ = round != nullptr && *round != '\0' ? round : "0";
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  return fd_ < 0 ? std::strerror(errno) : "";
}

SampleLog::~SampleLog() {
  if (fd_ >= 0) ::close(fd_);
}

void SampleLog::write(int64_t epoch, int64_t step, int rank, int world, const std::vector<int64_t>& order,
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

}  // namespace chorus::mnist
