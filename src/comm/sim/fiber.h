// A fiber: a function that runs on its own stack and switches to and from the one OS
// thread that created it, cooperatively. The simulator runs every rank's body as one.
//
// Contract: a Fiber is created, resumed and destroyed by one thread (the scheduler);
// the fiber's code calls suspend() to return to the scheduler, which later resumes it
// at the same point. When the entry function returns, the fiber is finished and
// resume() must not be called again. An exception must not leave the entry function.
//
// The stack is mmap'd (only the pages touched use memory) with a guard page below it,
// so that an overflow faults instead of overwriting another fiber's stack. The C++
// runtime's per-thread exception state (std::uncaught_exceptions(), the caught
// exceptions' chain) is swapped with the fiber, so that a fiber may suspend inside a
// catch block or while another fiber unwinds. Under AddressSanitizer and
// ThreadSanitizer every switch is announced to the sanitizer. On x86-64 the switch is a
// few instructions (callee-saved registers and the stack pointer; the signal mask and
// floating-point control words are not switched: fibers must not change them);
// elsewhere it is ucontext's swapcontext().
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace chorus::sim {

class Fiber {
 public:
  using Entry = void (*)(void* arg);

  // A fiber that will run entry(arg) on a stack of `stack_bytes` (rounded up to
  // pages) when first resumed. Throws SystemError when the stack cannot be mapped.
  Fiber(size_t stack_bytes, Entry entry, void* arg);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Scheduler side: runs the fiber until it suspends or finishes.
  void resume();
  // Fiber side: returns to the scheduler; returns when resumed.
  void suspend();
  bool finished() const { return finished_; }

 private:
  struct EhState {  // the C++ ABI's __cxa_eh_globals
    void* caught = nullptr;
    unsigned int uncaught = 0;
  };
  static void main(void* self);
  // Switches from the running side to the other; `to_fiber` says which way.
  void switch_to(bool to_fiber, bool exiting = false);

  Entry entry_;
  void* arg_;
  uint8_t* map_ = nullptr;  // guard page + stack
  size_t map_bytes_ = 0;
  uint8_t* stack_ = nullptr;  // lowest usable address
  size_t stack_bytes_ = 0;
  bool finished_ = false;
  EhState eh_;  // the side not running's exception state
#if defined(__x86_64__)
  void* fiber_sp_ = nullptr;
  void* caller_sp_ = nullptr;
#else
  ucontext_t fiber_ctx_, caller_ctx_;
#endif
  // Sanitizers' state: ASan's fake stack of the side switched away from and the
  // scheduler's stack bounds; TSan's fiber handles.
  void* fake_stack_ = nullptr;
  const void* caller_stack_ = nullptr;
  size_t caller_stack_bytes_ = 0;
  void* tsan_fiber_ = nullptr;
  void* tsan_caller_ = nullptr;
};

}  // namespace chorus::sim
