// Tensors in node-shared memory for torch code that allocates its own (torch 1.13's DDP
// Reducer makes its gradient buckets with at::empty): a CPU allocator that hands every
// allocation to the one torch had, except, on a thread inside a SharedAllocations
// scope, those of at least kSharedAllocationMinBytes, which it serves from
// chorus::allocate_shared (include/chorus/shared_memory.h). torch_chorus's
// DistributedDataParallel opens the scope around the few calls that allocate its
// buckets (python/torch_chorus/__init__.py).
//
// The scope is per thread, so other threads' tensors (a data loader's, the completion
// thread's) never land there: what does is decided by the code the scope covers alone,
// which, run by every rank of a node with the same shapes, makes the same allocations
// everywhere, as the direct path of the collectives requires.
#pragma once

#include <cstddef>

namespace chorus::c10d_backend {

// Allocations below this stay ordinary memory even inside a scope: each node-shared
// buffer costs a memory file and a page of header, and the direct path was measured
// 1.8-4.7x faster than the segment path from 64 KiB up (2 ranks); DDP's buckets are
// about a MiB and more (first_bucket_mb, bucket_cap_mb).
inline constexpr size_t kSharedAllocationMinBytes = 64 * 1024;

// Makes the allocator torch's CPU allocator (c10::SetCPUAllocator), wrapping the one
// installed before it. c10 expects that at initialization (it is not thread-safe):
// torch_chorus calls it when it is imported. Idempotent. Returns whether the allocator
// is installed (false when c10 kept one of higher priority).
bool install_shared_allocator();

// While one lives, this thread's CPU tensors of at least kSharedAllocationMinBytes are
// node-shared memory (when the allocator is installed). Nests.
class SharedAllocations {
 public:
  SharedAllocations();
  ~SharedAllocations();
  SharedAllocations(const SharedAllocations&) = delete;
  SharedAllocations& operator=(const SharedAllocations&) = delete;
};

}  // namespace chorus::c10d_backend
