#include "chorus/torch/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "chorus/error.h"

namespace chorus::torch_ext {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw SystemError(what + " '" + path + "': " + std::strerror(errno));
}

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail("cannot open for fsync", path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("cannot fsync", path);
}

std::string directory_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("epoch", torch::tensor(state.epoch));
  archive.write("step", torch::tensor(state.step));
  archive.write("sampler_position", torch::tensor(state.sampler_position));
  const std::string tmp = path + ".tmp";
  try {
    archive.save_to(tmp);
  } catch (const c10::Error& e) {
    throw SystemError("cannot write checkpoint '" + tmp + "': " + e.what_without_backtrace());
  }
  fsync_path(tmp, O_RDONLY);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename checkpoint over", path);
  fsync_path(directory_of(path), O_RDONLY | O_DIRECTORY);
}

std::optional<TrainingState> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                             torch::optim::Optimizer& optimizer) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    fail("cannot read checkpoint", path);
  }
  try {
    torch::serialize::InputArchive archive, model_archive, optimizer_archive;
    archive.load_from(path);
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    model.load(model_archive);
    optimizer.load(optimizer_archive);
    torch::Tensor epoch, step, position;
    archive.read("epoch", epoch);
    archive.read("step", step);
    archive.read("sampler_position", position);
    return TrainingState{epoch.item<int64_t>(), step.item<int64_t>(), position.item<int64_t>()};
  } catch (const c10::Error& e) {
    throw InvalidArgumentError("'" + path + "' is not a checkpoint of this model and optimizer: " +
                               e.what_without_backtrace());
  }
}

}  // namespace chorus::torch_ext
