// The local peers' node-shared buffers (comm/shared/memory_file.h) as this process maps
// them, kept from one collective to the next: a DDP bucket is mapped once, at its first
// direct collective, not at every one.
//
// A peer of this very process (ranks that are threads, in tests) needs no mapping: its
// buffer is found in the registry, at the address its owner uses, which is also what
// lets ThreadSanitizer see both sides of every access. A mapping whose owner freed the
// buffer (its header page says so) is dropped at the next sweep().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "comm/shared/memory_file.h"

namespace chorus::transport::shm {

class PeerFiles {
 public:
  PeerFiles() = default;
  ~PeerFiles();
  PeerFiles(const PeerFiles&) = delete;
  PeerFiles& operator=(const PeerFiles&) = delete;

  // The start (header page) of `ref`'s file in this process, mapping it on first use.
  // On failure returns null with `error` saying what failed and why.
  uint8_t* map(const shared::SharedRef& ref, std::string& error);
  // Unmaps the files whose owners have freed them.
  void sweep();

  size_t mapped() const { return files_.size(); }

 private:
  struct File {
    uint8_t* base;
    size_t bytes;
  };
  std::map<std::pair<int32_t, uint64_t>, File> files_;  // by owner pid and buffer id
};

}  // namespace chorus::transport::shm
