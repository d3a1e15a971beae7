#include "comm/transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <utility>

#include "chorus/error.h"

namespace chorus::transport::shm {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw SystemError("shared memory: " + what + " '/dev/shm/" + name + "' failed: " +
                    errno_text(err));
}

std::string new_name() {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%d.%016llx", kSegmentPrefix, static_cast<int>(getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

uint8_t* map(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mapping", name, errno);
  return static_cast<uint8_t*>(p);
}

}  // namespace

// One mapping per segment and process: ranks that are threads of one process (tests)
// share it, so that every atomic of the segment has one address in the process, as
// ThreadSanitizer needs to see the ranks' synchronisation (and as node-shared buffers
// of the same process have, peer_files.h).
struct Segment::Mapping {
  Mapping(uint8_t* d, size_t n) : data(d), size(n) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(data, size); }
  uint8_t* data;
  size_t size;
};

namespace {

std::mutex& mappings_mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

std::map<std::string, std::weak_ptr<Segment::Mapping>>& mappings() {
  static auto* m = new std::map<std::string, std::weak_ptr<Segment::Mapping>>;
  return *m;
}

void keep(const std::string& name, const std::shared_ptr<Segment::Mapping>& m) {
  std::lock_guard<std::mutex> lock(mappings_mutex());
  auto& all = mappings();
  for (auto it = all.begin(); it != all.end();) it = it->second.expired() ? all.erase(it) : std::next(it);
  all[name] = m;
}

std::shared_ptr<Segment::Mapping> kept(const std::string& name, size_t bytes) {
  std::lock_guard<std::mutex> lock(mappings_mutex());
  auto it = mappings().find(name);
  if (it == mappings().end()) return nullptr;
  auto m = it->second.lock();
  return m && m->size == bytes ? m : nullptr;
}

}  // namespace

Segment::~Segment() = default;

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    name_ = std::move(o.name_);
    mapping_ = std::move(o.mapping_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

Segment Segment::create(size_t bytes) {
  Segment s;
  s.name_ = new_name();
  int fd = shm_open(("/" + s.name_).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail("creating", s.name_, errno);
  s.linked_ = true;
  // posix_fallocate reserves the pages: a /dev/shm too small fails here, clearly,
  // instead of killing the job with SIGBUS on first touch.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    s.unlink();
    fail("reserving " + std::to_string(bytes) + " bytes for", s.name_, err);
  }
  try {
    s.mapping_ = std::make_shared<Mapping>(map(fd, bytes, s.name_), bytes);
    s.data_ = s.mapping_->data;
    keep(s.name_, s.mapping_);
  } catch (...) {
    close(fd);
    s.unlink();
    throw;
  }
  close(fd);
  s.size_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  Segment s;
  s.name_ = name;
  if ((s.mapping_ = kept(name, bytes)) != nullptr) {  // mapped by another rank of this process
    s.data_ = s.mapping_->data;
    s.size_ = bytes;
    return s;
  }
  int fd = shm_open(("/" + name).c_str(), O_RDWR, 0600);
  if (fd < 0) fail("opening", name, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw SystemError("shared memory: '/dev/shm/" + name + "' has " +
                      std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes));
  }
  try {
    s.mapping_ = std::make_shared<Mapping>(map(fd, bytes, name), bytes);
    s.data_ = s.mapping_->data;
    keep(name, s.mapping_);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  s.size_ = bytes;
  return s;
}

void Segment::unlink() {
  if (!linked_) return;
  shm_unlink(("/" + name_).c_str());
  linked_ = false;
}

int remove_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  size_t prefix = std::strlen(kSegmentPrefix);
  while (struct dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix, kSegmentPrefix) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + prefix, &end, 10);
    if (end == nullptr || *end != '.' || pid <= 0) continue;
    // ESRCH: no such process. EPERM means it exists (another user's): keep it.
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace chorus::transport::shm
