// Node-shared buffers (include/chorus/shared_memory.h) as the rest of chorus_comm sees
// them: anonymous memory files (memfd) of this process, each a header page and then the
// caller's bytes, registered process-wide so that a collective can tell whether the
// pointers it was given lie in one, and which. A layer of its own below transport/ and
// algorithms/: both, and the communicator, ask it where a buffer lies.
//
// A peer maps a file by opening /proc/<owner pid>/fd/<fd> (the shared-memory
// transport's transport/shm/peer_files.h); the owner keeps the descriptor open for the
// buffer's life. The header page says which buffer the file holds (a process-unique id,
// never reused, so that a descriptor number the owner reuses for a later buffer cannot
// be mistaken for it) and whether the owner has freed it, so that peers drop their
// mappings of freed buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus::shared {

inline constexpr uint64_t kFileMagic = 0x6c69662d73756f68ULL;  // "hous-fil"
inline constexpr size_t kFileHeaderBytes = 4096;

struct FileHeader {
  uint64_t magic;
  uint64_t id;
  uint64_t bytes;   // the caller's bytes, after the header page
  uint32_t freed;   // set (release) by the owner before it unmaps and closes the file
};

// Where a span of memory lies in a node-shared buffer: what a peer needs to map the
// buffer's file and find the span in it. `id` 0: not in node-shared memory.
struct SharedRef {
  uint64_t id = 0;
  int32_t pid = 0;          // the owner process
  int32_t fd = -1;          // the owner's descriptor of the file
  uint64_t map_bytes = 0;   // the file's length, header page included
  uint64_t offset = 0;      // of the span, from the file's start (header page included)
  explicit operator bool() const { return id != 0; }
};

// getpid(), remembered (and renewed in a forked child): glibc makes each call a system
// call, and the direct path asked several times per collective (a tenth of the time of
// a 16 KiB allreduce on node-shared buffers in perf's samples).
int32_t this_pid();

// The node-shared buffer of this process that holds all of [p, p + bytes), if any.
// bytes 0 counts as 1 (a zero-length span still has to lie somewhere).
SharedRef find_shared(const void* p, size_t bytes);

// The start of this process's mapping of its file `id` (its header page), or null
// when this process holds no such buffer (any more).
uint8_t* own_file(uint64_t id);

}  // namespace chorus::shared
