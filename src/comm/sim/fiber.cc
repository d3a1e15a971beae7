#include "comm/sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cxxabi.h>
#include <string>

#include "chorus/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CHORUS_SIM_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_SIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CHORUS_SIM_TSAN 1
#endif
#endif

#if defined(CHORUS_SIM_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(CHORUS_SIM_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__x86_64__)
// chorus_sim_switch(save, to): pushes the callee-saved registers, stores the stack
// pointer in *save, loads `to` and pops the registers saved there. A new stack starts
// at chorus_sim_start with r12 = argument and r13 = function (Fiber's constructor).
extern "C" void chorus_sim_switch(void** save, void* to);
extern "C" void chorus_sim_start();
asm(R"(
  .pushsection .text
  .globl chorus_sim_switch
  .hidden chorus_sim_switch
  .type chorus_sim_switch, @function
chorus_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size chorus_sim_switch, .-chorus_sim_switch
  .globl chorus_sim_start
  .hidden chorus_sim_start
  .type chorus_sim_start, @function
chorus_sim_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size chorus_sim_start, .-chorus_sim_start
  .popsection
)");
#endif

namespace chorus::sim {

namespace {

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

Fiber::Fiber(size_t stack_bytes, Entry entry, void* arg) : entry_(entry), arg_(arg) {
  const size_t page = page_size();
  stack_bytes_ = (stack_bytes + page - 1) / page * page;
  map_bytes_ = stack_bytes_ + page;
  void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) {
    throw SystemError("simulator: cannot map a fiber stack of " + std::to_string(stack_bytes_) +
                      " bytes: " + std::strerror(errno));
  }
  map_ = static_cast<uint8_t*>(m);
  mprotect(map_, page, PROT_NONE);  // the guard page, below the stack
  stack_ = map_ + page;
#if defined(__x86_64__)
  auto** sp = reinterpret_cast<void**>(stack_ + stack_bytes_);  // 16-byte aligned
  *--sp = reinterpret_cast<void*>(&chorus_sim_start);  // at top - 8: ret enters it aligned
  *--sp = nullptr;                                      // rbp
  *--sp = nullptr;                                      // rbx
  *--sp = this;                                         // r12: the argument
  *--sp = reinterpret_cast<void*>(&Fiber::main);        // r13: the function
  *--sp = nullptr;                                      // r14
  *--sp = nullptr;                                      // r15
  fiber_sp_ = sp;
#else
  getcontext(&fiber_ctx_);
  fiber_ctx_.uc_stack.ss_sp = stack_;
  fiber_ctx_.uc_stack.ss_size = stack_bytes_;
  fiber_ctx_.uc_link = nullptr;
  // makecontext passes ints; a pointer travels in two halves.
  auto bits = reinterpret_cast<uintptr_t>(this);
  makecontext(&fiber_ctx_, reinterpret_cast<void (*)()>(+[](unsigned hi, unsigned lo) {
                main(reinterpret_cast<void*>((uintptr_t{hi} << 32) | lo));
              }),
              2, static_cast<unsigned>(bits >> 32), static_cast<unsigned>(bits));
#endif
#if defined(CHORUS_SIM_TSAN)
  tsan_fiber_ = __tsan_create_fiber(0);
#endif
}

Fiber::~Fiber() {
#if defined(CHORUS_SIM_TSAN)
  if (tsan_fiber_ != nullptr) __tsan_destroy_fiber(tsan_fiber_);
#endif
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

void Fiber::main(void* self) {
  auto* f = static_cast<Fiber*>(self);
#if defined(CHORUS_SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &f->caller_stack_, &f->caller_stack_bytes_);
#endif
  f->entry_(f->arg_);
  f->finished_ = true;
  f->switch_to(false, true);  // never resumed
}

void Fiber::resume() {
  auto* globals = reinterpret_cast<EhState*>(abi::__cxa_get_globals());
  const EhState mine = *globals;
  *globals = eh_;
  switch_to(true);
  eh_ = *globals;
  *globals = mine;
}

void Fiber::suspend() { switch_to(false); }

void Fiber::switch_to(bool to_fiber, bool exiting) {
#if defined(CHORUS_SIM_ASAN)
  void* fake_save = nullptr;
  if (to_fiber) __sanitizer_start_switch_fiber(&fake_save, stack_, stack_bytes_);
  else __sanitizer_start_switch_fiber(exiting ? nullptr : &fake_save, caller_stack_, caller_stack_bytes_);
#endif
#if defined(CHORUS_SIM_TSAN)
  if (to_fiber) {
    tsan_caller_ = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(tsan_fiber_, 0);
  } else {
    __tsan_switch_to_fiber(tsan_caller_, 0);
  }
#endif
#if defined(__x86_64__)
  if (to_fiber) chorus_sim_switch(&caller_sp_, fiber_sp_);
  else chorus_sim_switch(&fiber_sp_, caller_sp_);
#else
  if (to_fiber) swapcontext(&caller_ctx_, &fiber_ctx_);
  else swapcontext(&fiber_ctx_, &caller_ctx_);
#endif
#if defined(CHORUS_SIM_ASAN)
  if (to_fiber) __sanitizer_finish_switch_fiber(fake_save, nullptr, nullptr);
  else __sanitizer_finish_switch_fiber(fake_save, &caller_stack_, &caller_stack_bytes_);
#endif
}

}  // namespace chorus::sim
