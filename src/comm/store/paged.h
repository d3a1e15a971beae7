// Waiting for and reading many keys at once, as a rendezvous of every rank's key does.
// One store request names at most store::rules::kMaxKeysPerRequest (65536) keys, fewer
// than the documented largest world size (2^20 ranks); these helpers ask about
// kPageKeys at a time instead, and wait in short slices so that the caller can look
// at other keys meanwhile (a rank that learns the job cannot form gives up at once).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "comm/common/deadline.h"

namespace chorus::store::pages {

// Keys per request: a WAIT of 4096 keys of ~10 bytes is a frame of ~60 KB.
inline constexpr size_t kPageKeys = 4096;

// Waits until every key of `keys` exists and returns their values, in order, waiting
// for and then reading one page of keys at a time. Waits in slices growing from 50 ms
// to 500 ms; after each slice that ends with keys still missing it calls
// `between_slices`, which may throw to give up. Throws TimeoutError when `deadline`
// passes: "store wait for N keys timed out after T ms; missing keys ..." (the missing
// keys of the page it was waiting for; later pages were not looked at).
std::vector<Bytes> wait_and_get(Store& store, const std::vector<std::string>& keys,
                                const Deadline& deadline,
                                const std::function<void()>& between_slices = {});

}  // namespace chorus::store::pages
