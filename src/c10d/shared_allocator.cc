#include "c10d/shared_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <memory>

#include "chorus/shared_memory.h"

namespace chorus::c10d_backend {
namespace {

// torch 2.3 made Allocator::allocate non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define CHORUS_ALLOCATE_CONST
#define CHORUS_ALLOCATOR_COPIES 1
#else
#define CHORUS_ALLOCATE_CONST const
#define CHORUS_ALLOCATOR_COPIES 0
#endif

thread_local int scope_depth = 0;

class SharedAllocator final : public c10::Allocator {
 public:
  explicit SharedAllocator(c10::Allocator* next) : next_(next) {}

  c10::DataPtr allocate(size_t bytes) CHORUS_ALLOCATE_CONST override {
    if (scope_depth == 0 || bytes < kSharedAllocationMinBytes) return next_->allocate(bytes);
    // The context keeps the buffer; the tensor's storage drops it with its last user.
    auto memory = std::make_unique<std::shared_ptr<SharedBuffer>>(allocate_shared(bytes));
    void* data = (*memory)->data();
    return {data, memory.release(), &release, c10::Device(c10::DeviceType::CPU)};
  }

  // The raw interface is the next allocator's: its raw_allocate() calls allocate(),
  // which outside a scope is the next one's. Inside a scope a large raw allocation
  // fails c10's check that the context is the data (loudly, never freeing node-shared
  // memory with the wrong deleter); torch's DDP setup makes none.
  c10::DeleterFnPtr raw_deleter() const override { return next_->raw_deleter(); }

#if CHORUS_ALLOCATOR_COPIES
  // Both kinds of memory are ordinary memory of this process: a plain copy.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static void release(void* context) { delete static_cast<std::shared_ptr<SharedBuffer>*>(context); }

  c10::Allocator* next_;
};

SharedAllocator* installed = nullptr;

}  // namespace

bool install_shared_allocator() {
  if (installed == nullptr) {
    c10::Allocator* before = c10::GetCPUAllocator();
    installed = new SharedAllocator(before);  // static lifetime, as c10 requires
    c10::SetCPUAllocator(installed);
  }
  return c10::GetCPUAllocator() == installed;
}

SharedAllocations::SharedAllocations() { ++scope_depth; }
SharedAllocations::~SharedAllocations() { --scope_depth; }

}  // namespace chorus::c10d_backend
