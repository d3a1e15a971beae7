#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>

#include "chorus/torch/data.h"

namespace chorus::data {
namespace {

const DistributedSamplerOptions& checked(int64_t dataset_size,
                                         const DistributedSamplerOptions& options) {
  if (dataset_size < 0) {
    throw InvalidArgumentError("DistributedSampler: dataset size " + std::to_string(dataset_size) +
                               " is negative");
  }
  if (options.num_replicas < 1) {
    throw InvalidArgumentError("DistributedSampler: num_replicas " +
                               std::to_string(options.num_replicas) + " is less than 1");
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    throw InvalidArgumentError("DistributedSampler: rank " + std::to_string(options.rank) +
                               " is outside [0, " + std::to_string(options.num_replicas) + ")");
  }
  return options;
}

// PyTorch: ceil((n - r) / r) with drop_last when r does not divide n, else
// ceil(n / r). For such n the first equals floor(n / r). A resumed sampler
// shares the n - start samples left the same way (none when start >= n).
int64_t samples_per_replica(int64_t dataset_size, const DistributedSamplerOptions& options,
                            int64_t start = 0) {
  int64_t r = options.num_replicas;
  int64_t n = std::max<int64_t>(dataset_size - start, 0);
  if (options.drop_last) return n / r;
  return (n + r - 1) / r;
}

// The whole dataset's order for an epoch: randperm from a fresh CPU generator
// seeded with seed + epoch (as PyTorch's uint64 manual_seed sees it), or 0..n-1.
std::vector<int64_t> permutation(int64_t n, bool shuffle, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (!shuffle) {
    std::iota(order.begin(), order.end(), int64_t{0});
    return order;
  }
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor perm = at::randperm(n, generator, at::kLong);
  std::copy_n(perm.data_ptr<int64_t>(), n, order.begin());
  return order;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size,
                                       const DistributedSamplerOptions& options)
    : dataset_size_(dataset_size),
      options_(checked(dataset_size, options)),
      num_samples_(samples_per_replica(dataset_size, options)) {}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch < 0) {
    throw InvalidArgumentError("DistributedSampler: epoch " + std::to_string(epoch) +
                               " is negative");
  }
  state_ = {epoch, 0, 0};
  num_samples_ = samples_per_replica(dataset_size_, options_);
}

void DistributedSampler::resume(int64_t epoch, int64_t consumed) {
  if (consumed < 0) {
    throw InvalidArgumentError("DistributedSampler: cannot resume after " + std::to_string(consumed) +
                               " consumed samples");
  }
  set_epoch(epoch);
  state_.start = consumed;
  num_samples_ = samples_per_replica(dataset_size_, options_, consumed);
}

// PyTorch pads the order to total_size by repeating it from its start
// (order[k % n]) or, with drop_last, cuts it to total_size (k < n then), and
// gives rank the positions rank, rank + r, rank + 2r, ... A resumed sampler
// does the same after its start.
std::vector<int64_t> DistributedSampler::epoch_indices() const {
  uint64_t seed = options_.seed + static_cast<uint64_t>(state_.epoch);
  std::vector<int64_t> order = permutation(dataset_size_, options_.shuffle, seed);
  std::vector<int64_t> indices(static_cast<size_t>(num_samples_));
  for (int64_t j = 0; j < num_samples_; ++j) {
    int64_t k = state_.start + options_.rank + j * options_.num_replicas;
    indices[j] = order[k % dataset_size_];
  }
  return indices;
}

std::vector<int64_t> DistributedSampler::remaining_indices() const {
  std::vector<int64_t> indices = epoch_indices();
  indices.erase(indices.begin(), indices.begin() + state_.position);
  return indices;
}

void DistributedSampler::advance(int64_t count) {
  if (count < 0 || count > num_samples_ - state_.position) {
    throw InvalidArgumentError("DistributedSampler: cannot advance by " + std::to_string(count) +
                               " from position " + std::to_string(state_.position) + " of " +
                               std::to_string(num_samples_));
  }
  state_.position += count;
}

void DistributedSampler::load_state(const SamplerState& state) {
  const int64_t num_samples =
      state.start < 0 ? -1 : samples_per_replica(dataset_size_, options_, state.start);
  if (state.epoch < 0 || num_samples < 0 || state.position < 0 || state.position > num_samples) {
    throw InvalidArgumentError("DistributedSampler: state (epoch " + std::to_string(state.epoch) +
                               ", position " + std::to_string(state.position) + ", start " +
                               std::to_string(state.start) + ") does not fit num_samples " +
                               std::to_string(num_samples));
  }
  state_ = state;
  num_samples_ = num_samples;
}

}  // namespace chorus::data
