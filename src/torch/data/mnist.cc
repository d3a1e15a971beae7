#include <ATen/ATen.h>

#include <memory>
#include <utility>

#include "chorus/torch/data.h"
#include "idx.h"

namespace chorus::data {
namespace {

constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr int64_t kNumClasses = 10;

struct SplitFiles {
  const char* images;
  const char* labels;
};

SplitFiles split_files(Split split) {
  if (split == Split::kTrain) return {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
  return {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
}

// Hands the parsed bytes to a tensor without copying them (47 MB for the
// training images); the tensor's deleter owns the vector.
at::Tensor to_byte_tensor(IdxArray array) {
  if (array.bytes.empty()) return at::empty(array.dims, at::kByte);
  auto* owned = new std::vector<uint8_t>(std::move(array.bytes));
  return at::from_blob(
      owned->data(), array.dims, [owned](void*) { delete owned; }, at::kByte);
}

at::Tensor load_images(const std::string& path) {
  IdxArray array = read_idx(path, 3);
  if (array.dims[1] != kRows || array.dims[2] != kCols) {
    throw DataError(path, "wrong dimensions: images are " + std::to_string(array.dims[1]) + "x" +
                              std::to_string(array.dims[2]) + ", expected 28x28");
  }
  return to_byte_tensor(std::move(array));
}

at::Tensor load_labels(const std::string& path) {
  IdxArray array = read_idx(path, 1);
  for (size_t i = 0; i < array.bytes.size(); ++i) {
    if (array.bytes[i] >= kNumClasses) {
      throw DataError(path, "label " + std::to_string(array.bytes[i]) + " at index " +
                                std::to_string(i) + " is outside [0, 9]");
    }
  }
  return to_byte_tensor(std::move(array)).to(at::kLong);
}

void check_index(int64_t index, int64_t size) {
  if (index < 0 || index >= size) {
    throw InvalidArgumentError("MnistDataset: index " + std::to_string(index) + " is outside [0, " +
                               std::to_string(size) + ")");
  }
}

}  // namespace

std::shared_ptr<const MnistDataset> MnistDataset::load(const MnistOptions& options) {
  SplitFiles names = split_files(options.split);
  std::string images_path = find_idx_file(options.directory, names.images);
  std::string labels_path = find_idx_file(options.directory, names.labels);
  at::Tensor images = load_images(images_path);
  at::Tensor labels = load_labels(labels_path);
  if (images.size(0) != labels.size(0)) {
    throw DataError(images_path + " and " + labels_path,
                    "counts disagree: " + std::to_string(images.size(0)) + " images but " +
                        std::to_string(labels.size(0)) + " labels");
  }
  return std::make_shared<const MnistDataset>(std::move(images), std::move(labels), options);
}

MnistDataset::MnistDataset(at::Tensor images, at::Tensor labels, const MnistOptions& options)
    : images_(std::move(images)),
      labels_(std::move(labels)),
      layout_(options.layout),
      normalize_(options.normalize) {
  bool images_ok = images_.dim() == 3 && images_.size(1) == kRows && images_.size(2) == kCols &&
                   images_.scalar_type() == at::kByte;
  bool labels_ok = labels_.dim() == 1 && labels_.scalar_type() == at::kLong;
  if (!images_ok || !labels_ok || images_.size(0) != labels_.size(0)) {
    throw InvalidArgumentError(
        "MnistDataset: expected images [N,28,28] uint8 and labels [N] int64");
  }
  if (normalize_ && normalize_->std == 0) {
    throw InvalidArgumentError("MnistDataset: Normalize std is 0 (division by zero)");
  }
}

int64_t MnistDataset::size() const { return labels_.size(0); }

// The same operations, in the same order and precision, as torchvision's
// ToTensor (to float32, then div(255)) and Normalize (sub_(mean), div_(std)
// with float32 tensors), so that the values are bitwise equal to PyTorch's.
at::Tensor MnistDataset::to_float(const at::Tensor& images) const {
  at::Tensor x = images.to(at::kFloat).div(255);
  x = layout_ == ImageLayout::kFlat ? x.reshape({images.size(0), kRows * kCols}) : x.unsqueeze(1);
  if (normalize_) {
    x.sub_(at::full({1}, normalize_->mean, at::kFloat));
    x.div_(at::full({1}, normalize_->std, at::kFloat));
  }
  return x;
}

Example MnistDataset::get(int64_t index) const {
  check_index(index, size());
  return {to_float(images_.narrow(0, index, 1))[0], labels_[index].clone()};
}

Batch MnistDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t index : indices) check_index(index, size());
  // A copy of the indices: from_blob would need a non-const pointer, and the
  // copy costs nothing next to the gather.
  at::Tensor rows = at::tensor(at::ArrayRef<int64_t>(indices), at::kLong);
  return {to_float(images_.index_select(0, rows)), labels_.index_select(0, rows)};
}

}  // namespace chorus::data
