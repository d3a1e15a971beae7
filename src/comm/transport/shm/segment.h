// A POSIX shared-memory segment (/dev/shm) mapped into this process.
//
// Names are "chorus.<creator pid>.<random>": unique per creation, so two jobs, or two
// communicators of one job, never meet in one segment, and a segment whose creator
// died can be recognised and removed by the next job (remove_stale_segments). The
// communicator unlinks a segment as soon as every local rank has mapped it, so a job
// killed after that leaves nothing behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chorus::transport::shm {

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates a new segment of `bytes` (zero-filled, backed by reserved memory so that a
  // full /dev/shm is an error here rather than a SIGBUS later) and maps it.
  static Segment create(size_t bytes);
  // Maps the existing segment `name`, which must be `bytes` long.
  static Segment open(const std::string& name, size_t bytes);

  // Removes the name; the mapping stays valid. Idempotent, never throws.
  void unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  struct Mapping;

 private:
  std::string name_;
  std::shared_ptr<Mapping> mapping_;  // shared by the ranks of this process (segment.cc)
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
};

// Removes the chorus segments in /dev/shm whose creator process no longer exists
// (left by a job killed while setting up). Returns how many it removed.
int remove_stale_segments();

// The prefix of every segment name, for tests.
inline constexpr const char* kSegmentPrefix = "chorus.";

}  // namespace chorus::transport::shm
