// chorus::allocate_shared(), chorus::in_shared_memory() and the process-wide registry
// of node-shared buffers (memory_file.h).
#include "comm/shared/memory_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "chorus/error.h"
#include "chorus/shared_memory.h"

namespace chorus {

struct SharedBuffer::Private {
  int fd = -1;
  uint8_t* base = nullptr;  // the header page, then the caller's bytes
  size_t map_bytes = 0;
  uint64_t id = 0;
};

namespace shared {
namespace {

struct Entry {
  size_t bytes;  // the caller's
  const SharedBuffer::Private* file;
};

// Buffers by the address of their first usable byte.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Entry> by_data;
  std::map<uint64_t, uint8_t*> by_id;
  // by_data's size, read without the lock: a process that holds no node-shared buffer
  // (most collectives' case) answers find_shared() without taking it.
  std::atomic<size_t> live{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers may outlive statics
  return *r;
}

std::atomic<uint64_t> next_id{1};

std::atomic<int32_t> cached_pid{0};  // 0: not read yet

[[noreturn]] void fail(const std::string& what, size_t bytes, int err) {
  throw SystemError("allocate_shared(" + std::to_string(bytes) + "): " + what + " failed: " +
                    std::strerror(err));
}

}  // namespace

int32_t this_pid() {
  int32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  static std::once_flag registered;
  std::call_once(registered, [] {
    pthread_atfork(nullptr, nullptr, [] { cached_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed); });
  });
  pid = static_cast<int32_t>(getpid());
  cached_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

SharedRef find_shared(const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const size_t n = bytes == 0 ? 1 : bytes;
  Registry& r = registry();
  if (r.live.load(std::memory_order_acquire) == 0) return {};
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_data.upper_bound(at);
  if (it == r.by_data.begin()) return {};
  --it;
  const uintptr_t begin = it->first;
  if (at - begin > it->second.bytes || it->second.bytes - (at - begin) < n) return {};
  const SharedBuffer::Private& f = *it->second.file;
  SharedRef ref;
  ref.id = f.id;
  ref.pid = this_pid();
  ref.fd = f.fd;
  ref.map_bytes = f.map_bytes;
  ref.offset = kFileHeaderBytes + (at - begin);
  return ref;
}

uint8_t* own_file(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_id.find(id);
  return it == r.by_id.end() ? nullptr : it->second;
}

}  // namespace shared

std::shared_ptr<SharedBuffer> allocate_shared(size_t bytes) {
  if (bytes == 0) throw InvalidArgumentError("allocate_shared: 0 bytes");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > (size_t{1} << 48)) {
    throw InvalidArgumentError("allocate_shared: " + std::to_string(bytes) + " bytes is too large");
  }
  auto f = std::make_unique<SharedBuffer::Private>();
  f->map_bytes = shared::kFileHeaderBytes + (bytes + page - 1) / page * page;
  f->id = shared::next_id.fetch_add(1);
  // Close-on-exec: a child the caller starts must not keep the memory alive.
  f->fd = memfd_create("chorus-shared", MFD_CLOEXEC);
  if (f->fd < 0) shared::fail("memfd_create", bytes, errno);
  auto cleanup = [&] {
    if (f->base != nullptr) munmap(f->base, f->map_bytes);
    close(f->fd);
  };
  if (ftruncate(f->fd, static_cast<off_t>(f->map_bytes)) != 0) {
    const int err = errno;
    cleanup();
    shared::fail("sizing the memory file", bytes, err);
  }
  // Reserve the pages now: out of memory is this error, not a SIGBUS on first touch.
  if (const int err = posix_fallocate(f->fd, 0, static_cast<off_t>(f->map_bytes)); err != 0) {
    cleanup();
    shared::fail("reserving the memory file's pages", bytes, err);
  }
  void* p = mmap(nullptr, f->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    cleanup();
    shared::fail("mapping the memory file", bytes, err);
  }
  f->base = static_cast<uint8_t*>(p);
  auto* h = reinterpret_cast<shared::FileHeader*>(f->base);
  h->magic = shared::kFileMagic;
  h->id = f->id;
  h->bytes = bytes;
  std::atomic_ref<uint32_t>(h->freed).store(0, std::memory_order_release);
  uint8_t* data = f->base + shared::kFileHeaderBytes;
  const SharedBuffer::Private* file = f.get();
  std::shared_ptr<SharedBuffer> buffer(new SharedBuffer(std::move(f)));
  buffer->data_ = data;
  buffer->size_ = bytes;
  shared::Registry& r = shared::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.by_data[reinterpret_cast<uintptr_t>(data)] = shared::Entry{bytes, file};
  r.live.store(r.by_data.size(), std::memory_order_release);
  r.by_id[file->id] = file->base;
  return buffer;
}

SharedBuffer::SharedBuffer(std::unique_ptr<Private> impl) : impl_(std::move(impl)) {}

SharedBuffer::~SharedBuffer() {
  {
    shared::Registry& r = shared::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.by_data.erase(reinterpret_cast<uintptr_t>(data_));
    r.live.store(r.by_data.size(), std::memory_order_release);
    r.by_id.erase(impl_->id);
  }
  // Peers that mapped the file drop their mappings when they next look (peer_files.h).
  auto* h = reinterpret_cast<shared::FileHeader*>(impl_->base);
  std::atomic_ref<uint32_t>(h->freed).store(1, std::memory_order_release);
  munmap(impl_->base, impl_->map_bytes);
  close(impl_->fd);
}

bool in_shared_memory(const void* data, size_t bytes) {
  return static_cast<bool>(shared::find_shared(data, bytes));
}

}  // namespace chorus
