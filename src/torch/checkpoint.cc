#include "chorus/torch/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

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

// The model's tensors and a copy of their values. Module::load gives a parameter the
// checkpoint's shape without complaint (it set_()s the tensor), so another model's
// checkpoint would load "successfully": the snapshot tells, and puts the model back.
class ModelSnapshot {
 public:
  explicit ModelSnapshot(torch::nn::Module& model) {
    for (const auto& item : model.named_parameters()) add(item.key(), item.value());
    for (const auto& item : model.named_buffers()) add(item.key(), item.value());
  }
  // The first tensor whose shape or type the load changed, as a message, or "".
  std::string reshaped() const {
    for (const Entry& e : entries_) {
      if (e.live.sizes() != e.copy.sizes() || e.live.scalar_type() != e.copy.scalar_type()) {
        return e.name + " is " + describe(e.live) + " there, " + describe(e.copy) + " here";
      }
    }
    return "";
  }
  void restore() {
    torch::NoGradGuard no_grad;
    for (Entry& e : entries_) e.live.set_(e.copy);
  }

 private:
  struct Entry {
    std::string name;
    torch::Tensor live, copy;
  };
  static std::string describe(const torch::Tensor& t) {
    std::ostringstream out;
    out << t.sizes() << " " << t.scalar_type();
    return out.str();
  }
  void add(const std::string& name, const torch::Tensor& t) {
    entries_.push_back({name, t, t.detach().clone()});
  }
  std::vector<Entry> entries_;
};

// A non-negative scalar count of the checkpoint. A field missing from an older
// checkpoint (`required` false) reads as 0.
int64_t read_count(torch::serialize::InputArchive& archive, const std::string& key,
                   const std::string& path, bool required) {
  torch::Tensor value;
  if (required) {
    archive.read(key, value);
  } else if (!archive.try_read(key, value)) {
    return 0;
  }
  if (value.numel() != 1 || value.scalar_type() != torch::kLong) {
    throw InvalidArgumentError("checkpoint '" + path + "': " + key + " is not one int64");
  }
  int64_t count = value.item<int64_t>();
  if (count < 0) {
    throw InvalidArgumentError("checkpoint '" + path + "': " + key + " is negative (" +
                               std::to_string(count) + ")");
  }
  return count;
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
  archive.write("world_size", torch::tensor(state.world_size));
  archive.write("consumed", torch::tensor(state.consumed));
  archive.write("global_batch", torch::tensor(state.global_batch));
  // Tensors have no uint64: the seed's bits travel as an int64.
  archive.write("sampler_seed", torch::tensor(static_cast<int64_t>(state.sampler_seed)));
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
    TrainingState state;
    state.epoch = read_count(archive, "epoch", path, true);
    state.step = read_count(archive, "step", path, true);
    state.sampler_position = read_count(archive, "sampler_position", path, true);
    state.world_size = read_count(archive, "world_size", path, false);
    state.consumed = read_count(archive, "consumed", path, false);
    state.global_batch = read_count(archive, "global_batch", path, false);
    torch::Tensor seed;
    if (archive.try_read("sampler_seed", seed)) {
      state.sampler_seed = static_cast<uint64_t>(seed.item<int64_t>());
    }
    if (state.world_size > 0 && state.consumed < state.sampler_position * state.world_size) {
      throw InvalidArgumentError("checkpoint '" + path + "' is inconsistent: " +
                                 std::to_string(state.consumed) + " samples consumed by " +
                                 std::to_string(state.world_size) + " ranks, fewer than " +
                                 std::to_string(state.sampler_position) + " each");
    }
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    ModelSnapshot before(model);
    try {
      model.load(model_archive);
      if (std::string why = before.reshaped(); !why.empty()) {
        throw InvalidArgumentError("'" + path + "' is not a checkpoint of this model: " + why);
      }
      optimizer.load(optimizer_archive);
    } catch (...) {
      before.restore();
      throw;
    }
    return state;
  } catch (const c10::Error& e) {
    throw InvalidArgumentError("'" + path + "' is not a checkpoint of this model and optimizer: " +
                               e.what_without_backtrace());
  }
}

StopAtCheckpoint::StopAtCheckpoint(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  const char* key = std::getenv(kStopAtCheckpointKeyVariable);
  if (key == nullptr || *key == '\0') return;
  key_ = key;
  // A client, as every rank but 0 of an env:// job (rank 1 here): the launcher hosts
  // the store.
  if (group_->rank() == 0) store_ = store_from_env(/*rank=*/1);
}

bool StopAtCheckpoint::requested() {
  if (!enabled()) return false;
  at::Tensor flag = torch::zeros({1}, torch::kInt32);
  if (group_->rank() == 0 && store_->check({key_})) flag.fill_(1);
  group_->broadcast(flag, 0).wait();
  return flag.item<int32_t>() != 0;
}

}  // namespace chorus::torch_ext
