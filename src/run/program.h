// The command line of each worker, built the way torchrun builds it from PROGRAM and
// its arguments (options.h):
//
//   -m MODULE ARGS...        PYTHON -u -m MODULE ARGS...
//   SCRIPT.py ARGS...        PYTHON -u SCRIPT.py ARGS...   (unless --no-python)
//   PROGRAM ARGS...          PROGRAM ARGS...               (anything else, or --no-python)
//
// and with --local-rank-arg, --local_rank=N after the last of them. PYTHON is
// python_interpreter(); -u keeps Python's output unbuffered, as torchrun does, so that
// a worker's last lines reach the console and the failure report.
#pragma once

#include <string>
#include <vector>

#include "run/options.h"

namespace chorus::run {

// --python when given, else /usr/bin/python3 when it is executable, else "python3"
// (found on the workers' PATH when they start).
std::string python_interpreter(const LaunchOptions& options);

// argv of the worker with this local rank; argv[0] is searched on PATH.
std::vector<std::string> worker_command(const LaunchOptions& options, int local_rank);

}  // namespace chorus::run
