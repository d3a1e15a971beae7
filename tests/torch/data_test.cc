// IDX parsing, the MNIST dataset and the DataLoader. The IDX files are made by
// the tests (raw and gzipped, well-formed and broken); the real Fashion-MNIST
// files are checked too when Debian's dataset-fashion-mnist is installed.
#include "chorus/torch/data.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "torch/data/idx.h"

namespace chorus::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// --- Making IDX files -------------------------------------------------------

Bytes idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes gzip(const Bytes& raw) {
  uLongf size = compressBound(raw.size()) + 64;
  Bytes out(size);
  z_stream stream{};
  // windowBits 15 + 16: a gzip wrapper, as in the .gz files on disk.
  EXPECT_EQ(deflateInit2(&stream, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  stream.next_in = const_cast<Bytef*>(raw.data());
  stream.avail_in = static_cast<uInt>(raw.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

Bytes iota_bytes(size_t n) {
  Bytes bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 % 256);
  return bytes;
}

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: ubyte, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: ubyte, 1 dimension

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/chorus_data_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an MNIST split: `count` images (pixel values i*7 % 256 over the
  // whole file) and labels i % 10, gzipped when `gz`.
  void write_split(const std::string& prefix, uint32_t images, uint32_t labels, bool gz) {
    Bytes image_file = idx_bytes(kImagesMagic, {images, 28, 28}, iota_bytes(images * 784));
    Bytes label_bytes(labels);
    for (uint32_t i = 0; i < labels; ++i) label_bytes[i] = static_cast<uint8_t>(i % 10);
    Bytes label_file = idx_bytes(kLabelsMagic, {labels}, label_bytes);
    std::string ext = gz ? ".gz" : "";
    write_file(path(prefix + "-images-idx3-ubyte" + ext), gz ? gzip(image_file) : image_file);
    write_file(path(prefix + "-labels-idx1-ubyte" + ext), gz ? gzip(label_file) : label_file);
  }

  fs::path dir_;
};

// Runs `f`, expects a DataError whose message holds every one of `parts`.
template <typename F>
void expect_data_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError thrown";
  } catch (const DataError& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "message \"" << error.what() << "\" lacks \"" << part << "\"";
    }
  }
}

// --- IDX parsing ------------------------------------------------------------

using IdxTest = TempDir;

TEST_F(IdxTest, ReadsRawAndGzipAlike) {
  Bytes file = idx_bytes(kImagesMagic, {2, 3, 4}, iota_bytes(24));
  write_file(path("a"), file);
  write_file(path("a.gz"), gzip(file));
  for (const char* name : {"a", "a.gz"}) {
    IdxArray array = read_idx(path(name), 3);
    EXPECT_EQ(array.dims, (std::vector<int64_t>{2, 3, 4})) << name;
    EXPECT_EQ(array.bytes, iota_bytes(24)) << name;
  }
}

TEST_F(IdxTest, ReadsAnEmptyArray) {
  write_file(path("empty.gz"), gzip(idx_bytes(kImagesMagic, {0, 28, 28}, {})));
  IdxArray array = read_idx(path("empty.gz"), 3);
  EXPECT_EQ(array.dims, (std::vector<int64_t>{0, 28, 28}));
  EXPECT_TRUE(array.bytes.empty());
}

TEST_F(IdxTest, MissingFile) {
  expect_data_error([&] { read_idx(path("nope"), 1); }, {path("nope"), "cannot open"});
}

TEST_F(IdxTest, FindPrefersRawThenGzipAndNamesBothWhenMissing) {
  write_file(path("x.gz"), {1});
  EXPECT_EQ(find_idx_file(dir_.string(), "x"), path("x.gz"));
  write_file(path("x"), {1});
  EXPECT_EQ(find_idx_file(dir_.string(), "x"), path("x"));
  expect_data_error([&] { find_idx_file(dir_.string(), "y"); },
                    {"missing", path("y") + " nor " + path("y.gz")});
}

TEST_F(IdxTest, WrongMagicSaysWhichWasExpected) {
  write_file(path("labels.gz"), gzip(idx_bytes(kLabelsMagic, {3}, {1, 2, 3})));
  expect_data_error([&] { read_idx(path("labels.gz"), 3); },
                    {path("labels.gz"), "wrong magic number 2049, expected 2051", "gzip"});
  // Right number of dimensions, wrong type (0x0D: float).
  write_file(path("floats"), idx_bytes(0x0D01, {1}, {0, 0, 0, 0}));
  expect_data_error([&] { read_idx(path("floats"), 1); }, {"wrong magic number 3329", "raw"});
}

TEST_F(IdxTest, TruncatedHeader) {
  write_file(path("short"), {0, 0, 8, 3, 0, 0});
  expect_data_error([&] { read_idx(path("short"), 3); },
                    {path("short"), "truncated", "expected 12 bytes of dimensions, got 2"});
  write_file(path("none"), {});
  expect_data_error([&] { read_idx(path("none"), 1); },
                    {"expected 4 bytes of magic number, got 0"});
}

TEST_F(IdxTest, TruncatedRawPayloadIsCaughtBeforeAllocating) {
  Bytes file = idx_bytes(kImagesMagic, {2, 3, 4}, iota_bytes(20));
  write_file(path("cut"), file);
  expect_data_error([&] { read_idx(path("cut"), 3); },
                    {path("cut"), "truncated raw file", "promises 24 payload bytes",
                     "file of 36 bytes holds at most 20"});
}

TEST_F(IdxTest, HugeHeaderCountsAreRejectedFromTheFileSize) {
  // 4e9 x 28 x 28 bytes promised by a 16-byte raw file and a tiny gzip file.
  Bytes header = idx_bytes(kImagesMagic, {4000000000u, 28, 28}, {});
  write_file(path("huge"), header);
  write_file(path("huge.gz"), gzip(header));
  expect_data_error([&] { read_idx(path("huge"), 3); }, {"promises 3136000000000 payload bytes"});
  expect_data_error([&] { read_idx(path("huge.gz"), 3); },
                    {"truncated gzip file", "promises 3136000000000 payload bytes"});
  write_file(path("overflow"),
             idx_bytes(kImagesMagic, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
  expect_data_error([&] { read_idx(path("overflow"), 3); }, {"overflow"});
}

TEST_F(IdxTest, TruncatedGzipPayload) {
  // A valid gzip stream whose content is 4 bytes short.
  write_file(path("cut.gz"), gzip(idx_bytes(kImagesMagic, {2, 3, 4}, iota_bytes(20))));
  expect_data_error([&] { read_idx(path("cut.gz"), 3); }, {path("cut.gz"), "truncated gzip file",
                                                           "expected 24 bytes of payload, got 20"});
}

TEST_F(IdxTest, TooLong) {
  Bytes file = idx_bytes(kLabelsMagic, {3}, {1, 2, 3, 4});
  write_file(path("long"), file);
  write_file(path("long.gz"), gzip(file));
  expect_data_error([&] { read_idx(path("long"), 1); }, {path("long"), "too long", "3 payload"});
  expect_data_error([&] { read_idx(path("long.gz"), 1); }, {path("long.gz"), "too long"});
}

TEST_F(IdxTest, CutOffGzipStream) {
  Bytes gz = gzip(idx_bytes(kImagesMagic, {4, 28, 28}, iota_bytes(4 * 784)));
  gz.resize(gz.size() / 2);
  write_file(path("half.gz"), gz);
  expect_data_error([&] { read_idx(path("half.gz"), 3); },
                    {path("half.gz"), "truncated gzip stream"});
}

TEST_F(IdxTest, CorruptGzip) {
  Bytes gz = gzip(idx_bytes(kImagesMagic, {4, 28, 28}, iota_bytes(4 * 784)));
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;  // the CRC-32 in the gzip trailer
  write_file(path("crc.gz"), bad_crc);
  expect_data_error([&] { read_idx(path("crc.gz"), 3); },
                    {path("crc.gz"), "corrupt gzip", "incorrect data check"});
  Bytes bad_block = gz;
  bad_block[10] = 0xFF;  // first deflate block: final, reserved type 3
  write_file(path("block.gz"), bad_block);
  expect_data_error([&] { read_idx(path("block.gz"), 3); },
                    {path("block.gz"), "corrupt gzip", "invalid block type"});
}

// --- MnistDataset -----------------------------------------------------------

using MnistTest = TempDir;

float to_tensor_value(int byte) { return static_cast<float>(byte) / 255.0f; }

TEST_F(MnistTest, LoadsRawTrainAndGzipTestSplits) {
  write_split("train", 5, 5, /*gz=*/false);
  write_split("t10k", 3, 3, /*gz=*/true);
  auto train = MnistDataset::load({.directory = dir_.string(), .split = Split::kTrain});
  auto test = MnistDataset::load({.directory = dir_.string(), .split = Split::kTest});
  EXPECT_EQ(train->size(), 5);
  EXPECT_EQ(test->size(), 3);
  Example example = train->get(4);
  EXPECT_EQ(example.data.sizes(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(example.data.scalar_type(), at::kFloat);
  EXPECT_EQ(example.target.scalar_type(), at::kLong);
  EXPECT_EQ(example.target.item<int64_t>(), 4);
  Bytes pixels = iota_bytes(5 * 784);
  EXPECT_EQ(example.data.flatten()[100].item<float>(), to_tensor_value(pixels[4 * 784 + 100]));
}

// torchvision's ToTensor is float32(byte) / 255 and Normalize is (x - mean) /
// std in float32: checked against torchvision 0.14 for all 256 bytes, with
// (0.5, 0.5) and with MNIST's usual (0.1307, 0.3081), where multiplying by the
// reciprocal of std instead would differ in 36 of them.
TEST(MnistValues, ToTensorAndNormalizeAreBitwiseTorchvisions) {
  at::Tensor images = at::arange(784, at::kLong).remainder(256).to(at::kByte).reshape({1, 28, 28});
  at::Tensor labels = at::zeros({1}, at::kLong);
  MnistDataset plain(images, labels, {.layout = ImageLayout::kFlat});
  at::Tensor x = plain.get(0).data;
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{784}));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(x[i].item<float>(), to_tensor_value(i)) << i;
  for (Normalize n : {Normalize{0.5, 0.5}, Normalize{0.1307, 0.3081}}) {
    MnistDataset normalized(images, labels, {.layout = ImageLayout::kFlat, .normalize = n});
    at::Tensor y = normalized.get(0).data;
    auto mean = static_cast<float>(n.mean);
    auto stddev = static_cast<float>(n.std);
    for (int i = 0; i < 256; ++i) {
      EXPECT_EQ(y[i].item<float>(), (to_tensor_value(i) - mean) / stddev) << i << " std " << n.std;
    }
  }
}

TEST(MnistValues, GetMatchesGetBatchAndChecksIndices) {
  at::Tensor images = at::randint(0, 256, {6, 28, 28}, at::kByte);
  at::Tensor labels = at::arange(6, at::kLong);
  MnistDataset dataset(images, labels, {.normalize = Normalize{0.25, 2.0}});
  Batch batch = dataset.get_batch({5, 0, 3});
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_TRUE(at::equal(batch.target, at::tensor({5, 0, 3}, at::kLong)));
  EXPECT_TRUE(at::equal(batch.data[0], dataset.get(5).data));
  EXPECT_TRUE(at::equal(batch.data[2], dataset.get(3).data));
  EXPECT_THROW(dataset.get(6), InvalidArgumentError);
  EXPECT_THROW(dataset.get_batch({0, -1}), InvalidArgumentError);
}

TEST(MnistValues, ZeroStdAndBadShapesAreRejected) {
  at::Tensor images = at::zeros({2, 28, 28}, at::kByte);
  at::Tensor labels = at::zeros({2}, at::kLong);
  EXPECT_THROW(MnistDataset(images, labels, {.normalize = Normalize{0.5, 0.0}}),
               InvalidArgumentError);
  EXPECT_THROW(MnistDataset(images, at::zeros({3}, at::kLong), {}), InvalidArgumentError);
  EXPECT_THROW(MnistDataset(images.to(at::kFloat), labels, {}), InvalidArgumentError);
}

TEST_F(MnistTest, MissingFileNamesBothCandidates) {
  write_split("train", 2, 2, /*gz=*/true);
  fs::remove(path("train-labels-idx1-ubyte.gz"));
  expect_data_error(
      [&] { MnistDataset::load({.directory = dir_.string()}); },
      {"missing", path("train-labels-idx1-ubyte"), path("train-labels-idx1-ubyte.gz")});
}

TEST_F(MnistTest, CountsDisagree) {
  write_split("train", 3, 2, /*gz=*/true);
  expect_data_error([&] { MnistDataset::load({.directory = dir_.string()}); },
                    {path("train-images-idx3-ubyte.gz"), path("train-labels-idx1-ubyte.gz"),
                     "counts disagree: 3 images but 2 labels"});
}

TEST_F(MnistTest, WrongImageDimensions) {
  write_split("train", 2, 2, /*gz=*/false);
  write_file(path("train-images-idx3-ubyte"),
             idx_bytes(kImagesMagic, {2, 27, 28}, Bytes(2 * 27 * 28)));
  expect_data_error([&] { MnistDataset::load({.directory = dir_.string()}); },
                    {path("train-images-idx3-ubyte"), "wrong dimensions", "27x28, expected 28x28"});
}

TEST_F(MnistTest, LabelOutOfRange) {
  write_split("t10k", 2, 2, /*gz=*/false);
  write_file(path("t10k-labels-idx1-ubyte"), idx_bytes(kLabelsMagic, {2}, {3, 10}));
  expect_data_error(
      [&] { MnistDataset::load({.directory = dir_.string(), .split = Split::kTest}); },
      {path("t10k-labels-idx1-ubyte"), "label 10 at index 1"});
}

// What /usr/bin/python3 with torchvision 0.14 reads from Debian's files.
TEST(FashionMnist, RealFilesMatchTorchvision) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " missing: apt-get install dataset-fashion-mnist";
  auto train = MnistDataset::load({.directory = dir});
  auto test = MnistDataset::load({.directory = dir, .split = Split::kTest});
  ASSERT_EQ(train->size(), 60000);
  ASSERT_EQ(test->size(), 10000);
  EXPECT_TRUE(at::equal(train->labels().narrow(0, 0, 16),
                        at::tensor({9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9, 5, 5, 7, 9}, at::kLong)));
  EXPECT_TRUE(at::equal(test->labels().narrow(0, 0, 16),
                        at::tensor({9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5, 7, 3, 4, 1}, at::kLong)));
  EXPECT_EQ(train->raw_images().sum(at::kLong).item<int64_t>(), 3431114169);
  EXPECT_EQ(test->raw_images().sum(at::kLong).item<int64_t>(), 573469082);
  EXPECT_TRUE(at::equal(at::bincount(train->labels()), at::full({10}, 6000, at::kLong)));
  // torchvision: training_data[0][0].flatten()[99] == 0x1.a1a1a2p-5 (13 / 255).
  EXPECT_EQ(train->get(0).data.flatten()[99].item<float>(), 0x1.a1a1a2p-5f);
}

// --- DataLoader -------------------------------------------------------------

// Sample i is [i, -i] with target i. Optionally slow (jittered by index, so
// that workers finish out of order), or failing at one index.
class TestDataset : public Dataset {
 public:
  explicit TestDataset(int64_t size, int64_t fail_at = -1, int sleep_ms = 0)
      : size_(size), fail_at_(fail_at), sleep_ms_(sleep_ms) {}

  int64_t size() const override { return size_; }

  Example get(int64_t index) const override {
    if (index < 0 || index >= size_) throw InvalidArgumentError("TestDataset: index out of range");
    if (index == fail_at_) throw std::runtime_error("sample " + std::to_string(index) + " is bad");
    if (sleep_ms_ > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_ * (index % 3)));
    auto value = static_cast<float>(index);
    return {at::tensor({value, -value}), at::scalar_tensor(index, at::kLong)};
  }

  Batch get_batch(const std::vector<int64_t>& indices) const override {
    ++batches_built;
    return Dataset::get_batch(indices);
  }

  mutable std::atomic<int> batches_built{0};

 private:
  int64_t size_;
  int64_t fail_at_;
  int sleep_ms_;
};

std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

std::vector<int64_t> shuffled(int64_t n) {
  DistributedSampler sampler(n, {.seed = 7});
  return sampler.epoch_indices();
}

TEST(DataLoaderTest, SameBatchesWithAndWithoutWorkers) {
  auto dataset = std::make_shared<TestDataset>(100, -1, /*sleep_ms=*/1);
  std::vector<int64_t> order = shuffled(100);
  DataLoader sync(dataset, order, {.batch_size = 7});
  std::vector<Batch> expected = drain(sync);
  ASSERT_EQ(expected.size(), 15u);  // 14 full batches and one of 2
  EXPECT_EQ(expected.back().size(), 2);
  EXPECT_TRUE(at::equal(expected[0].target, at::tensor(at::ArrayRef<int64_t>(order.data(), 7))));
  for (int64_t workers : {1, 3}) {
    DataLoader loader(dataset, order, {.batch_size = 7, .workers = workers});
    std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), expected.size()) << workers;
    for (size_t i = 0; i < batches.size(); ++i) {
      EXPECT_TRUE(at::equal(batches[i].data, expected[i].data)) << workers << " " << i;
      EXPECT_TRUE(at::equal(batches[i].target, expected[i].target)) << workers << " " << i;
    }
    EXPECT_FALSE(loader.next().has_value());
  }
}

TEST(DataLoaderTest, DropLastAndDefaultOrder) {
  auto dataset = std::make_shared<TestDataset>(10);
  DataLoader loader(dataset, {.batch_size = 4, .drop_last = true, .workers = 2});
  EXPECT_EQ(loader.num_batches(), 2);
  std::vector<Batch> batches = drain(loader);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_TRUE(at::equal(batches[1].target, at::tensor({4, 5, 6, 7}, at::kLong)));
  EXPECT_EQ(batches[1].data.sizes(), (std::vector<int64_t>{4, 2}));
}

TEST(DataLoaderTest, WorkerExceptionSurfacesAtItsBatch) {
  for (int64_t workers : {0, 3}) {
    auto dataset = std::make_shared<TestDataset>(50, /*fail_at=*/23);
    DataLoader loader(dataset, {.batch_size = 5, .workers = workers});
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(loader.next().has_value()) << workers;
    try {
      loader.next();
      ADD_FAILURE() << "batch 4 (samples 20..24) should fail, workers " << workers;
    } catch (const std::runtime_error& error) {
      EXPECT_STREQ(error.what(), "sample 23 is bad");
    }
    // The loader is finished: the same error again, not later batches.
    EXPECT_THROW(loader.next(), std::runtime_error);
  }
}

TEST(DataLoaderTest, PrefetchIsBoundedByTheWindow) {
  auto dataset = std::make_shared<TestDataset>(100);
  DataLoader loader(dataset, {.batch_size = 1, .workers = 2, .prefetch_factor = 1});
  ASSERT_TRUE(loader.next().has_value());
  // The batch taken plus a window of workers * prefetch_factor = 2: wait (at
  // most 10 s) for the workers to fill it, then give them time to overfill it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (dataset->batches_built.load() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(dataset->batches_built.load(), 3);
}

TEST(DataLoaderTest, SlowWorkerTimesOutAndStopsCleanly) {
  auto dataset = std::make_shared<TestDataset>(10, -1, /*sleep_ms=*/200);
  // Sample 2 sleeps 400 ms; the loader waits 50 ms.
  DataLoader loader(dataset, std::vector<int64_t>{2},
                    {.workers = 1, .timeout = std::chrono::milliseconds(50)});
  EXPECT_THROW(loader.next(), TimeoutError);
  EXPECT_THROW(loader.next(), TimeoutError);
}

TEST(DataLoaderTest, DestroyedMidEpochJoinsItsWorkers) {
  auto dataset = std::make_shared<TestDataset>(1000, -1, /*sleep_ms=*/1);
  {
    DataLoader loader(dataset, {.batch_size = 10, .workers = 3});
    ASSERT_TRUE(loader.next().has_value());
  }
  int built = dataset->batches_built.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dataset->batches_built.load(), built);  // no worker left running
  EXPECT_EQ(dataset.use_count(), 1);                // nor holding the dataset
}

TEST(DataLoaderTest, RejectsBadOptions) {
  auto dataset = std::make_shared<TestDataset>(10);
  EXPECT_THROW(DataLoader(dataset, {.batch_size = 0}), InvalidArgumentError);
  EXPECT_THROW(DataLoader(dataset, {.workers = -1}), InvalidArgumentError);
  EXPECT_THROW(DataLoader(dataset, {.prefetch_factor = 0}), InvalidArgumentError);
  EXPECT_THROW(DataLoader(nullptr, {}), InvalidArgumentError);
}

TEST(DataLoaderTest, OutOfRangeIndexFailsAtItsBatch) {
  auto dataset = std::make_shared<TestDataset>(10);
  DataLoader loader(dataset, std::vector<int64_t>{0, 1, 2, 10}, {.batch_size = 2, .workers = 1});
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_THROW(loader.next(), InvalidArgumentError);
}

}  // namespace
}  // namespace chorus::data
