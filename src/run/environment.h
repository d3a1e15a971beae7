// What every part of the launcher reads its input as: the environment as a map, and the
// error a bad command line or option value is. The ground of src/run: the options and
// the cluster environments (cluster_env.h) both stand on it.
#pragma once

#include <map>
#include <string>

#include "chorus/error.h"

namespace chorus::run {

// A bad command line or option value: a ConfigError (chorus/error.h) that chorusrun
// reports as a usage error, printing what() and exiting with code 2. The message always
// names the option (e.g. "--node-rank 2: must be less than --nnodes (2)").
class UsageError : public ConfigError {
 public:
  explicit UsageError(const std::string& m) : ConfigError(m) {}
};

// The process environment as a map (tests pass their own).
using Environment = std::map<std::string, std::string>;
Environment current_environment();

}  // namespace chorus::run
