#include "c10d/work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>

#include "chorus/error.h"

namespace chorus::c10d_backend {

void Comms::abort_all(const std::string& reason) {
  if (collectives) collectives->abort(reason);
  for (auto& c : p2p) {
    if (c) c->abort(reason);
  }
}

ChorusWork::ChorusWork(int rank, ::c10d::OpType type, ::chorus::Work operation,
                       std::vector<at::Tensor> outputs, Finisher finish,
                       std::vector<at::Tensor> keep, std::shared_ptr<Comms> comms,
                       std::weak_ptr<Completer> completer, ::chorus::Work partner,
                       LaterDone later_done)
    : ::c10d::Work(rank, type),
      operation_(std::move(operation)),
      partner_(std::move(partner)),
      later_done_(std::move(later_done)),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)),
      keep_(std::move(keep)),
      comms_(std::move(comms)),
      completer_(std::move(completer)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void ChorusWork::complete() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> guard(complete_mutex_);
    if (done_) return;
    try {
      operation_.wait();
      partner_.wait();
      if (finish_) finish_();
    } catch (const Error& e) {
      error = std::current_exception();
      if (e.is_fatal() && comms_) comms_->abort_all(e.what());
    } catch (const std::exception&) {
      error = std::current_exception();
    }
    finish_ = nullptr;
    keep_.clear();
    done_ = true;
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
    cv_.notify_all();
  }
  // Outside the locks: the future's callbacks run here and may wait on this work.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

bool ChorusWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  if (!operation_done()) return false;
  complete();
  return true;
}

bool ChorusWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr ChorusWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> ChorusWork::result() { return outputs_; }

int ChorusWork::sourceRank() const {
  const int source = std::max(operation_.source(), partner_.source());
  if (source >= 0) return source;
  return ::c10d::Work::sourceRank();  // raises: not a completed receive
}

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  // chorus's Work::wait(timeout) returns false while the operation is still running.
  if (timeout > std::chrono::milliseconds(0) &&
      !(operation_.wait(timeout) && partner_.wait(timeout))) {
    throw TimeoutError(operation_.description() + " did not complete within the " +
                       std::to_string(timeout.count()) + " ms given to wait()");
  }
  complete();
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> ChorusWork::getFuture() {
  if (!future_asked_.exchange(true)) {
    if (auto completer = completer_.lock()) {
      completer->push(c10::intrusive_ptr<ChorusWork>::reclaim_copy(this));
    } else {
      complete();  // the group is gone, and with it every operation it ran
    }
  }
  return future_;
}

#if TORCH_VERSION_MAJOR >= 2
CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<ChorusWork>> works)
    : ::c10d::Work(rank, ::c10d::OpType::COALESCED),
      works_(std::move(works)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

bool CoalescedWork::isCompleted() {
  for (auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (const auto& w : works_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (const auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  std::exception_ptr first;
  for (auto& w : works_) {
    try {
      w->wait(timeout);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  if (!future_->completed()) {
    std::vector<at::Tensor> outputs;
    std::exception_ptr first;
    for (auto& w : works_) {
      w->complete();
      if (!first) first = w->exception();
      if (!first) {
        for (at::Tensor& t : w->result()) outputs.push_back(t);
      }
    }
    if (first) {
      future_->setErrorIfNeeded(first);
    } else {
      future_->markCompleted(c10::IValue(outputs));
    }
  }
  return future_;
}

#endif

Completer::~Completer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

void Completer::push(c10::intrusive_ptr<ChorusWork> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    if (idle_ == 0 && threads_.size() < kMaxThreads) {
      threads_.emplace_back([this] { loop(); });
      return;  // the new thread finds the work without a notification
    }
  }
  cv_.notify_one();
}

bool Completer::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_cv_.wait_until(lock, deadline,
                             [&] { return queue_.empty() && idle_ == threads_.size(); });
}

void Completer::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    idle_cv_.notify_all();
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;
    c10::intrusive_ptr<ChorusWork> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work->complete();
    work.reset();
    lock.lock();
  }
}

}  // namespace chorus::c10d_backend
