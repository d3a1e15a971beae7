#include <ATen/ATen.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "chorus/torch/data.h"

namespace chorus::data {

// Workers claim batch numbers in order and build them concurrently; next()
// takes them back in order, so the sequence never depends on thread timing.
// A window of `capacity` batches past the one next() takes bounds the memory
// held by finished batches.
class DataLoader::Prefetcher {
 public:
  Prefetcher(const DataLoader& loader, int64_t workers, int64_t capacity)
      : loader_(loader), capacity_(capacity) {
    try {
      for (int64_t i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop();  // the threads already started must not outlive a failed constructor
      throw;
    }
  }

  ~Prefetcher() { stop(); }

  // Batch `number` (the next in order), once a worker has built it; rethrows
  // what the worker caught while building it.
  Batch take(int64_t number, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    if (!ready_.wait_until(lock, deadline, [&] { return done_.count(number) > 0; })) {
      throw TimeoutError("DataLoader: batch " + std::to_string(number) + " not built within " +
                         std::to_string(timeout.count()) + " ms by " +
                         std::to_string(threads_.size()) + " workers");
    }
    Slot slot = std::move(done_.at(number));
    done_.erase(number);
    next_take_ = number + 1;
    lock.unlock();
    space_.notify_all();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.batch);
  }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  void run() {
    int64_t number = 0;
    while (claim(&number)) {
      Slot slot;
      try {
        slot.batch = loader_.build(number);
      } catch (...) {
        slot.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.emplace(number, std::move(slot));
      }
      ready_.notify_one();  // next() is the only waiter
    }
  }

  // Waits for room in the window; false when stopping or nothing is left.
  // The wait needs no deadline: next() or the destructor always ends it.
  bool claim(int64_t* number) {
    std::unique_lock<std::mutex> lock(mutex_);
    space_.wait(lock, [&] {
      return stop_ || next_claim_ >= loader_.num_batches_ || next_claim_ < next_take_ + capacity_;
    });
    if (stop_ || next_claim_ >= loader_.num_batches_) return false;
    *number = next_claim_++;
    return true;
  }

  const DataLoader& loader_;
  const int64_t capacity_;
  std::mutex mutex_;
  std::condition_variable space_;  // workers wait here for room in the window
  std::condition_variable ready_;  // next() waits here for its batch
  bool stop_ = false;              // guarded by mutex_
  int64_t next_claim_ = 0;         // guarded by mutex_
  int64_t next_take_ = 0;          // guarded by mutex_
  std::map<int64_t, Slot> done_;   // guarded by mutex_
  std::vector<std::thread> threads_;
};

namespace {

void check_options(const Dataset* dataset, const DataLoaderOptions& options) {
  if (dataset == nullptr) throw InvalidArgumentError("DataLoader: dataset is null");
  if (options.batch_size < 1 || options.workers < 0 || options.prefetch_factor < 1) {
    throw InvalidArgumentError(
        "DataLoader: need batch_size >= 1, workers >= 0 and "
        "prefetch_factor >= 1; got " +
        std::to_string(options.batch_size) + ", " + std::to_string(options.workers) + " and " +
        std::to_string(options.prefetch_factor));
  }
}

std::vector<int64_t> all_indices(const Dataset* dataset) {
  if (dataset == nullptr) throw InvalidArgumentError("DataLoader: dataset is null");
  std::vector<int64_t> indices(static_cast<size_t>(dataset->size()));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  return indices;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::vector<int64_t> indices,
                       const DataLoaderOptions& options)
    : dataset_(std::move(dataset)), indices_(std::move(indices)), options_(options) {
  check_options(dataset_.get(), options_);
  auto count = static_cast<int64_t>(indices_.size());
  num_batches_ = options_.drop_last ? count / options_.batch_size
                                    : (count + options_.batch_size - 1) / options_.batch_size;
  if (options_.workers > 0 && num_batches_ > 0) {
    prefetcher_ = std::make_unique<Prefetcher>(*this, options_.workers,
                                               options_.workers * options_.prefetch_factor);
  }
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options)
    : DataLoader(dataset, all_indices(dataset.get()), options) {}

// The Prefetcher's destructor stops and joins the workers before the members
// they read (dataset_, indices_) go away.
DataLoader::~DataLoader() { prefetcher_.reset(); }

std::optional<Batch> DataLoader::next() {
  if (failure_) std::rethrow_exception(failure_);
  if (next_batch_ >= num_batches_) return std::nullopt;
  int64_t number = next_batch_++;
  try {
    return prefetcher_ ? prefetcher_->take(number, options_.timeout) : build(number);
  } catch (...) {
    failure_ = std::current_exception();
    prefetcher_.reset();  // nothing will be taken any more: stop building
    throw;
  }
}

Batch DataLoader::build(int64_t number) const {
  auto begin = static_cast<size_t>(number * options_.batch_size);
  size_t end = std::min(indices_.size(), begin + static_cast<size_t>(options_.batch_size));
  std::vector<int64_t> batch(indices_.begin() + begin, indices_.begin() + end);
  return dataset_->get_batch(batch);
}

}  // namespace chorus::data
