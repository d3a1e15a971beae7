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

// Sets CHORUS_JOB_TOKEN for this process and its workers when the user set none: a
// random one for a standalone job; a multi-node job keeps the rdzv id (with a warning
// when that is the default).
void choose_job_token(const LaunchOptions& options);

}  // namespace chorus::run
