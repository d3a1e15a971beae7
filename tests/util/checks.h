// Small test helpers shared by the suites: the message of an expected error, a
// substring check, and polling for state that has no notification to wait on.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "comm/common/deadline.h"

namespace chorus::test {

// Whether `text` (an error message, a program's output) contains `part`.
inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// How often `part` occurs in `text` (overlapping occurrences count).
inline size_t occurrences(std::string_view text, std::string_view part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string_view::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Runs `fn` and returns the message of the `E` it throws; fails the test otherwise.
template <typename E, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// Polls `condition` until it holds or `timeout` passes: for state that has no
// notification to wait on (a server's client count).
template <typename Condition>
bool eventually(Condition condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  Deadline deadline(timeout);
  while (!condition()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace chorus::test
