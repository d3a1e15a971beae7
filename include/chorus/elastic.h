// Stopping at a checkpoint so that a joining node is admitted (chorusrun
// --join-at-checkpoint, docs/launcher.md#elastic-jobs): what chorusrun and its workers
// agree on. chorus_torch's StopAtCheckpoint (chorus/torch/checkpoint.h) is the workers'
// side; any other program may implement it from these two names.
//
// With the option, chorusrun gives every worker of an elastic job's round the variable
// below: the name of a key in the launchers' store (CHORUS_STORE_ADDR:CHORUS_STORE_PORT,
// job token CHORUS_JOB_TOKEN). When a node joins, node 0's launcher sets that key. The
// workers look at it after each checkpoint they save, all at the same one (a collective
// decision), and when it is set every worker exits with the status below. chorusrun takes
// that exit as the round's planned end, not as a failure, and starts the next round with
// the newcomer; workers that reach no checkpoint in time are stopped as without the option.
#pragma once

namespace chorus {

inline constexpr const char* kStopAtCheckpointKeyVariable = "CHORUS_STOP_AT_CHECKPOINT_KEY";

// sysexits.h's EX_TEMPFAIL ("try again later"). chorusrun counts it only from the
// workers of a round whose key was set; otherwise it is an exit status like any other.
inline constexpr int kStoppedAtCheckpointStatus = 75;

}  // namespace chorus
