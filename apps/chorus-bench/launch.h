// chorus-bench --np N: N local ranks of this same program, started and supervised by
// run::WorkerGroup, the machinery of chorusrun (run/workers.h).
//
// The launcher hosts the ranks' store itself (CHORUS_STORE_HOSTED=1), on a port the
// kernel picks while the store binds it, so no other process can take the port between
// choosing and binding it. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, the store's address (CHORUS_STORE_ADDR/PORT, and the same in
// MASTER_ADDR/MASTER_PORT), with --nodes its CHORUS_NODE_ID, and is bound to CPUs as
// chorusrun binds its workers (--cpu-bind) by its place among all the ranks on this
// machine, simulated nodes or not.
#pragma once

#include "options.h"

namespace chorus::bench {

// Runs the ranks until all have exited. Their output reaches this process's stdout and
// stderr line by line. The first rank that fails, or the --timeout deadline, stops the
// others; what happened is said on stderr. Returns the program's exit status: 0 when
// every rank exited 0, else 1. Throws when the store or a rank cannot be started.
int launch_local_ranks(const Options& options, int argc, char** argv);

}  // namespace chorus::bench
