// A one-word wake-up flag for waits that spin briefly and then sleep in the kernel
// (futex). Tests run 8 ranks on 2 cores, so a pure busy-wait would starve the peers;
// a short spin still keeps small-message latency low when a core is free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace chorus {

// Waits until `word` differs from `old`, or the deadline passes. Spins with yields for
// up to `spin` first. Returns false on timeout. Wake-ups come from futex_wake().
bool futex_wait_change(std::atomic<uint32_t>& word, uint32_t old,
                       std::chrono::steady_clock::time_point deadline,
                       std::chrono::microseconds spin = std::chrono::microseconds(20));
// Wakes every thread of this process sleeping on `word`.
void futex_wake_all(std::atomic<uint32_t>& word);

}  // namespace chorus
