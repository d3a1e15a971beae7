// chorusrun's main loop: meet the other launchers, start this node's workers, watch
// them and the other nodes, stop everything on the first failure, restart the whole
// job while restarts remain, and report.
#pragma once

#include "run/options.h"

namespace chorus::run {

// Runs the job described by `options` to the end. Returns chorusrun's exit code: 0 when
// every worker of every node exited 0; the first failed worker's code (128 + signal for
// a signal) otherwise; 128 + signal when the launcher itself was told to stop; 1 for a
// launcher error (rendezvous timeout) or a lost launcher of any node (liveness.h),
// printed to stderr.
int run_job(const LaunchOptions& options);

}  // namespace chorus::run
