#include "run/program.h"

#include <unistd.h>

namespace chorus::run {
namespace {

// Debian's torch lives with the system interpreter; a python3 first on PATH (a pyenv
// or virtualenv shim) often has no torch, so the system one is preferred.
constexpr const char* kSystemPython = "/usr/bin/python3";

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string python_interpreter(const LaunchOptions& options) {
  if (!options.python.empty()) return options.python;
  return access(kSystemPython, X_OK) == 0 ? kSystemPython : "python3";
}

std::vector<std::string> worker_command(const LaunchOptions& options, int local_rank) {
  std::vector<std::string> argv;
  if (options.module) {
    argv = {python_interpreter(options), "-u", "-m"};
  } else if (!options.no_python && ends_with(options.program, ".py")) {
    argv = {python_interpreter(options), "-u"};
  }
  argv.push_back(options.program);
  argv.insert(argv.end(), options.program_args.begin(), options.program_args.end());
  if (options.local_rank_arg) argv.push_back("--local_rank=" + std::to_string(local_rank));
  return argv;
}

}  // namespace chorus::run
