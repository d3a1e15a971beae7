// What the tests of chorusrun's option parsing share (options_test.cc,
// option_errors_test.cc): parsing with a given environment and CPU count, and the message
// of the UsageError that parsing must throw.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "run/options.h"

namespace chorus::run::test {

using Args = std::vector<std::string>;

inline LaunchOptions parse(const Args& args, const Environment& env = {}, int cpus = 4) {
  return parse_options(args, env, cpus);
}

inline std::string joined(const Args& args) {
  std::string text;
  for (const std::string& arg : args) text += " '" + arg + "'";
  return text;
}

// The message of the UsageError that parsing must throw (a test failure when none is).
inline std::string usage_error(const Args& args, const Environment& env = {}) {
  try {
    parse(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for" << joined(args);
  return "";
}

}  // namespace chorus::run::test
