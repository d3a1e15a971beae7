// PeerFiles (peer_files.h).
#include "comm/transport/shm/peer_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace chorus::transport::shm {

PeerFiles::~PeerFiles() {
  for (auto& [key, f] : files_) munmap(f.base, f.bytes);
}

uint8_t* PeerFiles::map(const shared::SharedRef& ref, std::string& error) {
  if (ref.pid == shared::this_pid()) {
    uint8_t* own = shared::own_file(ref.id);
    if (own == nullptr) error = "this process holds no node-shared buffer " + std::to_string(ref.id) + " (freed?)";
    return own;
  }
  const auto key = std::make_pair(ref.pid, ref.id);
  if (auto it = files_.find(key); it != files_.end()) return it->second.base;
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    error = "opening " + path + " failed: " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != ref.map_bytes) {
    error = path + " is not the published memory file (" + std::to_string(st.st_size) + " bytes, not " +
            std::to_string(ref.map_bytes) + ")";
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, ref.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) {
    error = "mapping " + path + " failed: " + std::strerror(err);
    return nullptr;
  }
  auto* h = static_cast<shared::FileHeader*>(p);
  if (h->magic != shared::kFileMagic || h->id != ref.id ||
      std::atomic_ref<uint32_t>(h->freed).load(std::memory_order_acquire) != 0) {
    error = path + " holds another or a freed buffer, not buffer " + std::to_string(ref.id);
    munmap(p, ref.map_bytes);
    return nullptr;
  }
  files_.emplace(key, File{static_cast<uint8_t*>(p), ref.map_bytes});
  return static_cast<uint8_t*>(p);
}

void PeerFiles::sweep() {
  for (auto it = files_.begin(); it != files_.end();) {
    auto* h = reinterpret_cast<shared::FileHeader*>(it->second.base);
    if (std::atomic_ref<uint32_t>(h->freed).load(std::memory_order_acquire) != 0) {
      munmap(it->second.base, it->second.bytes);
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace chorus::transport::shm
