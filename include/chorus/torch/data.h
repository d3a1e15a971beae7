// chorus_torch data: IDX datasets (MNIST, Fashion-MNIST), PyTorch's
// DistributedSampler, and a data loader with background prefetch.
//
// Error policy: every failure is thrown as a chorus::Error subclass.
//   DataError (an InvalidArgumentError)  a data file is missing, unreadable or
//       malformed. The message names the file and the problem ("wrong magic
//       number 2049, expected 2051 (ubyte, 3 dimensions)", "truncated: expected
//       47040016 bytes, got 47040000", "corrupt gzip: ...").
//   InvalidArgumentError  a call was wrong (rank outside [0, num_replicas),
//       batch_size 0, index out of range, a std of 0, ...).
//   TimeoutError  DataLoader::next waited longer than DataLoaderOptions::timeout.
// Nothing here keeps global state; objects are independent of each other.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/error.h"

namespace chorus::data {

// A data file could not be used. path() is the file (or the file set) at fault.
class DataError : public InvalidArgumentError {
 public:
  DataError(const std::string& path, const std::string& problem)
      : InvalidArgumentError(path + ": " + problem), path_(path) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// One sample: data shaped like a single item (e.g. [1,28,28]), target a 0-dim
// int64 tensor.
struct Example {
  at::Tensor data;
  at::Tensor target;
};

// Samples stacked along a new first dimension: data [B,...], target [B] int64.
struct Batch {
  at::Tensor data;
  at::Tensor target;
  int64_t size() const { return target.size(0); }
};

// A random-access dataset. Implementations must be safe to call from several
// threads at once through the const methods (the DataLoader's workers do).
class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of samples; indices run over [0, size()).
  virtual int64_t size() const = 0;

  // The sample at `index`. Throws InvalidArgumentError when index is out of range.
  virtual Example get(int64_t index) const = 0;

  // The samples at `indices`, stacked. The default stacks get(i) and throws
  // InvalidArgumentError for an empty list (no shape to stack); datasets that
  // hold their samples in one tensor override it with a single gather.
  // Throws InvalidArgumentError when any index is out of range.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

enum class Split { kTrain, kTest };

// How images are shaped: [1,28,28] per sample like torchvision, or flat [784]
// (what an MLP's first Linear layer takes).
enum class ImageLayout { kImage, kFlat };

// transforms.Normalize(mean, std): x = (x - mean) / std, after the [0,1] scaling.
struct Normalize {
  double mean = 0.5;
  double std = 0.5;
};

struct MnistOptions {
  // Holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
  // and t10k-labels-idx1-ubyte, each raw or gzipped (the name with ".gz").
  // The default is where Debian's dataset-fashion-mnist package puts them.
  std::string directory = "/usr/share/datasets/fashion-mnist";
  Split split = Split::kTrain;
  ImageLayout layout = ImageLayout::kImage;
  std::optional<Normalize> normalize = std::nullopt;  // none: plain ToTensor, in [0,1]
};

// MNIST or Fashion-MNIST (the file format and shapes are the same). The files
// are read and checked once, in load(); the dataset is immutable afterwards, so
// it is safe to share between threads. Images are float32 scaled exactly like
// torchvision's ToTensor (uint8 / 255), then normalized if asked; labels are
// int64 in [0, 9].
class MnistDataset : public Dataset {
 public:
  // Reads the split's two files. Throws DataError when a file is missing (both
  // names tried are given), unreadable, not gzip-valid, has the wrong magic
  // number, is truncated or too long, has images other than 28x28, has a label
  // outside [0, 9], or when image and label counts disagree. Throws
  // InvalidArgumentError when normalize->std is 0.
  static std::shared_ptr<const MnistDataset> load(const MnistOptions& options);

  int64_t size() const override;
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  // The raw images [N,28,28] uint8 and labels [N] int64, as read from the files.
  const at::Tensor& raw_images() const { return images_; }
  const at::Tensor& labels() const { return labels_; }

  // Wraps tensors already in memory (load() uses it; so can tests). Shares
  // them, does not copy. options.directory and options.split are not used.
  // Throws InvalidArgumentError unless images is [N,28,28] uint8 and labels is
  // [N] int64, or when normalize->std is 0. Labels are not range-checked here.
  MnistDataset(at::Tensor images, at::Tensor labels, const MnistOptions& options);

 private:
  at::Tensor to_float(const at::Tensor& images) const;

  at::Tensor images_;  // [N,28,28] uint8
  at::Tensor labels_;  // [N] int64
  ImageLayout layout_;
  std::optional<Normalize> normalize_;
};

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  // the world size
  int64_t rank = 0;          // in [0, num_replicas)
  bool shuffle = true;
  uint64_t seed = 0;  // the same on every rank
  bool drop_last = false;
};

// Where a sampler stands, for checkpoints: the epoch, how many samples of the
// epoch's global order were consumed before this sampler's share began (0
// unless it was resumed, possibly at another world size: see resume()), and
// how many of this rank's samples after that were consumed. Every rank has
// the same number of samples, so rank 0's state is valid for all ranks.
struct SamplerState {
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t start = 0;
};

// torch.utils.data.DistributedSampler, index for index: for the same dataset
// size, num_replicas, rank, shuffle, seed, drop_last and epoch it yields the
// same indices as PyTorch 1.13 (a CPU generator seeded with seed + epoch,
// randperm, padding by repeating the list from its start, or truncation with
// drop_last, then every num_replicas-th index from rank). A value type; not
// synchronized: use one per thread.
//
// The epoch's global order is its permutation; rank r's j-th sample is global
// position r + j * num_replicas. With a loader of `b` samples per rank, step s
// of the epoch therefore consumes global positions [s*B, (s+1)*B) on all ranks
// together (B = b * num_replicas, position s*B + k on rank k % num_replicas),
// so "the first `consumed` positions" is exactly what was trained on. resume()
// starts a sampler of any world size after them: rank r's j-th sample is then
// position consumed + r + j * num_replicas, and the ranks share the rest of the
// permutation as above (padded by repeating the permutation from its start, or
// cut with drop_last, exactly like a fresh epoch of n - consumed samples). Any
// number of world-size changes within an epoch thus use every position once.
class DistributedSampler {
 public:
  // Throws InvalidArgumentError when dataset_size < 0, num_replicas < 1 or rank
  // is outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, const DistributedSamplerOptions& options);

  // Starts epoch `epoch` (>= 0) from its beginning (position 0), like
  // PyTorch's set_epoch before iterating.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return state_.epoch; }

  // Starts epoch `epoch` after the first `consumed` samples of its global
  // order, consumed by ranks of whatever world size (a checkpoint's
  // consumed()). resume(e, 0) is set_epoch(e); consumed >= dataset_size
  // leaves nothing of the epoch (a padded last step may consume more positions
  // than the dataset has). Throws InvalidArgumentError when epoch < 0 or
  // consumed < 0.
  void resume(int64_t epoch, int64_t consumed);

  // This rank's samples per epoch (PyTorch's len(sampler)); after resume(),
  // its share of the samples not consumed before.
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * num_replicas.
  int64_t total_size() const { return num_samples_ * options_.num_replicas; }

  // This rank's whole index list for the current epoch, num_samples() long
  // (after resume(): its share of what was left).
  std::vector<int64_t> epoch_indices() const;

  // The part of epoch_indices() not consumed yet: from position() on. A
  // resumed job builds its loader from these.
  std::vector<int64_t> remaining_indices() const;

  // Records that `count` more samples were consumed (after a training step).
  // Throws InvalidArgumentError when the position would pass num_samples().
  void advance(int64_t count);
  int64_t position() const { return state_.position; }
  // Samples of this epoch's global order consumed by all ranks together:
  // start + position() * num_replicas. What a checkpoint records so that a job
  // of another world size can resume() where this one stopped.
  int64_t consumed() const { return state_.start + state_.position * options_.num_replicas; }

  SamplerState state() const { return state_; }
  // Throws InvalidArgumentError when epoch < 0, start is not one resume()
  // takes, or position is outside [0, num_samples()] for that start.
  void load_state(const SamplerState& state);

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  SamplerState state_;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  // false: the last batch may be smaller; true: it is dropped (DataLoader's).
  bool drop_last = false;
  // Background threads that build the next batches. 0 builds each batch in
  // next(), on the caller's thread. The order of batches never depends on it.
  int64_t workers = 0;
  // Batches built ahead per worker (the queue holds workers * prefetch_factor).
  int64_t prefetch_factor = 2;
  // The longest next() waits for a worker's batch before TimeoutError.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// One pass over a dataset in a given index order, batch by batch (PyTorch's
// DataLoader iterator; build a new one per epoch). The loader shares ownership
// of the dataset. next() must be called from one thread at a time; the workers
// only call the dataset's const methods. Destroying the loader stops the
// workers and joins them (a worker finishes the batch it is building first).
class DataLoader {
 public:
  // Batches of `indices` in order. Throws InvalidArgumentError when dataset is
  // null, batch_size < 1, workers < 0 or prefetch_factor < 1 (indices out of
  // range are reported by the dataset, at the batch that holds them).
  DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
             const DataLoaderOptions& options);
  // Batches of 0, 1, ..., dataset->size()-1 (no shuffling: the test set).
  DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options);
  ~DataLoader();

  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch, or nullopt after the last. An exception thrown while
  // building this batch (by the dataset, in a worker or not) is rethrown here;
  // the loader is then finished and every later call rethrows it too.
  // Throws TimeoutError when no batch arrives within options.timeout.
  std::optional<Batch> next();

  int64_t num_batches() const { return num_batches_; }

 private:
  class Prefetcher;

  Batch build(int64_t batch_number) const;

  std::shared_ptr<const Dataset> dataset_;
  std::vector<int64_t> indices_;
  DataLoaderOptions options_;
  int64_t num_batches_;
  int64_t next_batch_ = 0;
  std::exception_ptr failure_;
  std::unique_ptr<Prefetcher> prefetcher_;  // null when workers == 0
};

}  // namespace chorus::data
