// Node-shared memory: buffers that the ranks of one node can read and write directly,
// so that collectives on them move each byte once instead of copying it through the
// node's segment first (NCCL's ncclMemAlloc with ncclCommRegister, in one call).
//
//   auto buf = chorus::allocate_shared(count * sizeof(float));   // or comm->allocate_shared()
//   float* x = static_cast<float*>(buf->data());
//   ... fill x ...
//   comm->allreduce(x, count, DataType::kFloat32, ReduceOp::kSum).wait();
//
// Allocation is local: no communication, any thread, any time, any size per rank. The
// bytes live in an anonymous memory file (memfd) that this process maps; the local peers
// map it themselves the first time a collective of theirs needs it, through
// /proc/<pid>/fd (same user). Nothing has a name in a file system, so a job that dies,
// however it dies, leaves nothing behind: the kernel frees the memory with the last
// process that maps it.
//
// The direct path (docs/library.md, "Node-shared memory"): a collective whose ranks of
// one node all pass buffers inside shared buffers (allreduce, reduce_scatter, allgather:
// send and recv, in place or not; broadcast: recv, and send on the root) reads and writes
// the peers' buffers directly, through shared memory:
//   allreduce       the ranks share the buffer out in pieces; whoever takes a piece sums
//                   it over every rank's buffer, in rank order, and writes the sum into
//                   every rank's buffer: each element is read once per rank and written
//                   once per rank, and every rank gets the same bytes;
//   reduce_scatter  each block is summed the same way into its owner's buffer;
//   allgather       each block is copied from its owner into every rank's buffer;
//   broadcast       the root's buffer is copied into every rank's.
// (A piece is done by one rank for all: with no more ranks than cores each takes a
// contiguous share.) The path takes two phases where a small call through the node's
// segment takes one, so it is taken where the cost model predicts it faster: from about
// 16 KiB with the built-in parameters. Every other case takes the ordinary path. Ranks
// of one node that disagree (some pass shared buffers, some do not) fail a call large
// enough for the direct path with PeerError naming both, as for any other mismatch. CHORUS_SHM_DIRECT=0 (CommOptions::shm_direct) turns the direct path
// off: shared buffers are then ordinary memory.
//
// Ordering: no rank reads or writes a peer's buffer before that peer has entered the
// collective, nor after it has returned: a collective's Work completes once every local
// peer is done with this rank's buffer, so the caller may overwrite it at once.
//
// Lifetime: the memory is valid until the last shared_ptr to the SharedBuffer is
// dropped, whether or not a communicator still exists; the same rules as for any buffer
// apply (valid and untouched until the Work that uses it completes). A peer's mapping of
// a freed buffer is released at that peer's next direct collective, or when its
// communicator is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace chorus {

class SharedBuffer {
 public:
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  // The usable bytes: page-aligned, zero-filled at allocation, `size()` long (the size
  // asked for; the mapping is rounded up to whole pages).
  void* data() const { return data_; }
  size_t size() const { return size_; }

  struct Private;  // the memory file and its mapping (src/comm/shared/)

 private:
  friend std::shared_ptr<SharedBuffer> allocate_shared(size_t bytes);
  explicit SharedBuffer(std::unique_ptr<Private> impl);
  std::unique_ptr<Private> impl_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Allocates `bytes` of node-shared memory (above). Throws InvalidArgumentError for 0
// bytes, SystemError (naming what failed and why) when the memory file cannot be
// created, reserved or mapped. Its pages are reserved at allocation (counted against
// the process's memory limits), so running out of memory is this error, not a SIGBUS.
std::shared_ptr<SharedBuffer> allocate_shared(size_t bytes);

// Whether all of [data, data + bytes) lies in one SharedBuffer of this process that is
// still alive, as a collective on that span would find it: a span across two buffers,
// or past one's size(), is not. A span of 0 bytes asks about the byte at `data`. Any
// thread, any time; no communication, and no lock while the process holds no
// SharedBuffer. The answer holds for as long as that buffer lives.
bool in_shared_memory(const void* data, size_t bytes);

}  // namespace chorus
