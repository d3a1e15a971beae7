// Lockstep: the cheapest way for the processes of one machine to wait for each other
// once a step, for plain-libtorch-mnist --lockstep (bench/compare_mnist.sh's sync2
// config). A data-parallel job cannot finish a step before its slowest rank finishes
// its gradients; plain loops that meet at such a barrier and move no data show what
// that alone costs on the machine, so that a 2-rank run's gap to 2 lone loops splits
// into the machine's (the loops' step times vary, and every step waits for the slower)
// and the communication library's.
//
// The barrier is two words in a file every process maps: how many have arrived, and a
// generation the last arrival advances. Waiters spin (with the CPU's pause) for up to
// kSpin, as chorus's shared-memory waits do, then sleep on the generation's futex.
// Every wait has a deadline, and runs out into an error naming the step and the rank.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace chorus::bench {

class Lockstep {
 public:
  // Maps `path` (created, at least 8 bytes of zeros, before any process arrives) as
  // rank `rank` of `size` processes.
  Lockstep(const std::string& path, int rank, int size, std::chrono::seconds deadline)
      : rank_(rank), size_(static_cast<uint32_t>(size)), deadline_(deadline) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw std::invalid_argument("lockstep: rank " + std::to_string(rank) + " is not in 0.." +
                                  std::to_string(size - 1));
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("lockstep: cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kBytes)) {
      ::close(fd);
      throw std::runtime_error("lockstep: " + path + " must hold at least " + std::to_string(kBytes) +
                               " zero bytes before the processes start");
    }
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error("lockstep: cannot map " + path + ": " + std::strerror(err));
    words_ = static_cast<uint32_t*>(p);
  }
  ~Lockstep() { ::munmap(words_, kBytes); }
  Lockstep(const Lockstep&) = delete;
  Lockstep& operator=(const Lockstep&) = delete;

  // Returns once all `size` processes have called it for step `step`.
  void arrive_and_wait(int64_t step) {
    uint32_t* arrived = &words_[0];
    uint32_t* generation = &words_[1];
    const uint32_t seen = __atomic_load_n(generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(arrived, 1, __ATOMIC_ACQ_REL) == size_) {
      __atomic_store_n(arrived, 0, __ATOMIC_RELAXED);
      __atomic_store_n(generation, seen + 1, __ATOMIC_RELEASE);
      ::syscall(SYS_futex, generation, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
      return;
    }
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto spin_until = start + kSpin, give_up = start + deadline_;
    for (uint32_t i = 1;; ++i) {
      if (__atomic_load_n(generation, __ATOMIC_ACQUIRE) != seen) return;
      if ((i & 63) != 0) {
        __builtin_ia32_pause();
        continue;
      }
      const auto now = Clock::now();
      if (now >= give_up) {
        throw std::runtime_error("lockstep: rank " + std::to_string(rank_) + " waited " +
                                 std::to_string(deadline_.count()) + " s at step " + std::to_string(step) +
                                 " for the other " + std::to_string(size_ - 1) +
                                 " process(es), which did not arrive");
      }
      if (now < spin_until) continue;
      timespec nap{0, 10'000'000};  // re-checks the deadline every 10 ms
      ::syscall(SYS_futex, generation, FUTEX_WAIT, seen, &nap, nullptr, 0);
    }
  }

 private:
  static constexpr size_t kBytes = 8;
  static constexpr std::chrono::microseconds kSpin{400};
  int rank_;
  uint32_t size_;
  std::chrono::seconds deadline_;
  uint32_t* words_ = nullptr;
};

}  // namespace chorus::bench
