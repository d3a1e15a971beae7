// Starting chorusrun from tests: in an environment without the variables of any job
// the test itself may run in (a launcher reads them), with short deadlines, and as the
// launchers of simulated nodes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/ranks.h"

namespace chorus::test {

// build/bin/chorusrun (CHORUS_BIN_DIR).
std::string chorusrun_path();
// The workers the chorusrun tests start: build/bin/chorus_test_worker (a rank of an
// env:// job, tests/comm/helpers) and build/bin/workers_test_helper (a scriptable
// process, tests/run/helpers).
std::string test_worker_path();
std::string scripted_worker_path();

// Variables removed from a launcher's inherited environment: the rendezvous variables
// of an outer job, the cluster's, and every option variable (CHORUS_RUN_*, PET_*)
// the tests use.
const std::vector<std::string>& launcher_unset_env();

// chorusrun with `args`; `env` is set on top (CHORUS_CONNECT_TIMEOUT=30 and
// CHORUS_TIMEOUT=60 unless it says otherwise).
std::unique_ptr<Subprocess> start_chorusrun(const std::vector<std::string>& args,
                                            std::map<std::string, std::string> env = {});

// The options of node `node` (0 or 1) of a job of two simulated nodes with `nproc`
// workers each: node 0's launcher hosts the store on 127.0.0.2:`port`, node 0's workers
// listen on 127.0.0.2 and node 1's on 127.0.0.3; the rdzv id is unique to the port.
std::vector<std::string> simulated_node_options(int node, uint16_t port, int nproc);

// The status and output of each launcher of a job, node by node (a node not started,
// a null pointer, is left out): what a test of simulated nodes prints when it fails.
std::string launchers_output(const std::vector<std::unique_ptr<Subprocess>>& nodes);

// Whether `pid` still runs something; a zombie counts as gone (whether init reaps
// orphans promptly differs between machines).
bool process_alive(pid_t pid);
// Waits until every pid is gone (true) or `within` passes (false).
bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds within);

}  // namespace chorus::test
