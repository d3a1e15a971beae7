// The flight recorders' traces of a worker that is stopped by SIGTERM. chorusrun stops
// the workers it still has with SIGTERM, then SIGKILL after --grace-period, when the job
// fails (a worker failed, a node's launcher was lost) or is stopped. A worker in a
// collective with a node whose launcher died may get that SIGTERM before its own
// collective has failed: under load, 22 of 30 runs of
// Liveness.KilledLauncherDuringACollectiveIsTheCause left no trace at all, although
// it is exactly what the user needs to see where each rank stood.
//
// So while a communicator with a flight recorder lives, SIGTERM (if its disposition was
// the default when the first one was created: a handler of the program's own, or
// SIG_IGN, is left alone) makes every live communicator of the process write its trace
// (CHORUS_TRACE_DIR, the usual one line on the console), after which the process dies
// of SIGTERM as it would have: its exit status does not change. The handler only writes
// a byte to a pipe; a thread of its own does the writing, outside the signal handler.
// The launcher's SIGKILL after the grace period bounds the time this takes. A process
// forked after the handler was installed (a data loader's worker) dies of SIGTERM at
// once, as if nothing were installed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace chorus::communicator {

// Registers `write`, called with the reason when the process gets SIGTERM, until
// remove_stop_trace(id). The first call installs the handler (see above). `write` must
// not call add_stop_trace() or remove_stop_trace().
uint64_t add_stop_trace(std::function<void(const std::string& why)> write);
// Unregisters; waits for a `write` of this id that is running to return.
void remove_stop_trace(uint64_t id);

}  // namespace chorus::communicator
