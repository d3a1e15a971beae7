#include <ATen/ATen.h>

#include "chorus/torch/data.h"

namespace chorus::data {

// The generic path, for datasets that build each sample on its own: what
// PyTorch's default collate does (stack the samples along a new dimension).
Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  if (indices.empty()) {
    throw InvalidArgumentError("Dataset::get_batch: no indices (cannot infer the sample shape)");
  }
  std::vector<at::Tensor> data;
  std::vector<at::Tensor> targets;
  data.reserve(indices.size());
  targets.reserve(indices.size());
  for (int64_t index : indices) {
    Example example = get(index);
    data.push_back(std::move(example.data));
    targets.push_back(std::move(example.target));
  }
  return {at::stack(data), at::stack(targets)};
}

}  // namespace chorus::data
