#include "util/chorusrun.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <thread>

namespace chorus::test {

std::string chorusrun_path() { return std::string(CHORUS_BIN_DIR) + "/chorusrun"; }
std::string test_worker_path() { return std::string(CHORUS_BIN_DIR) + "/chorus_test_worker"; }
std::string scripted_worker_path() { return std::string(CHORUS_BIN_DIR) + "/workers_test_helper"; }

const std::vector<std::string>& launcher_unset_env() {
  static const std::vector<std::string> names = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "CHORUS_STORE_HOSTED",
      "CHORUS_STORE_ADDR", "CHORUS_STORE_PORT", "CHORUS_JOB_TOKEN",
      "CHORUS_RUN_NPROC_PER_NODE", "CHORUS_RUN_NNODES", "CHORUS_RUN_NODE_RANK",
      "CHORUS_RUN_CPU_BIND", "CHORUS_RUN_PYTHON", "PET_NPROC_PER_NODE", "PET_NNODES",
      "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_STANDALONE",
      "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_MODULE", "PET_NO_PYTHON"};
  return names;
}

std::unique_ptr<Subprocess> start_chorusrun(const std::vector<std::string>& args,
                                            std::map<std::string, std::string> env) {
  SpawnOptions o;
  o.args = args;
  o.unset_env = launcher_unset_env();
  env.emplace("CHORUS_CONNECT_TIMEOUT", "30");
  env.emplace("CHORUS_TIMEOUT", "60");
  o.env = env;
  return std::make_unique<Subprocess>(chorusrun_path(), o);
}

std::vector<std::string> simulated_node_options(int node, uint16_t port, int nproc) {
  return {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node",
          std::to_string(nproc), "--master-addr", "127.0.0.2", "--master-port",
          std::to_string(port), "--local-addr", node == 0 ? "127.0.0.2" : "127.0.0.3",
          "--rdzv-id", "job-" + std::to_string(port)};
}

std::string launchers_output(const std::vector<std::unique_ptr<Subprocess>>& nodes) {
  std::string text;
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (!nodes[k]) continue;
    text += "--- node " + std::to_string(k) + " (" + nodes[k]->status_text() + "):\n" +
            nodes[k]->output_text();
  }
  return text;
}

bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  size_t close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] != 'Z';
}

bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds within) {
  auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (pid_t p : pids) any |= process_alive(p);
    if (!any) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace chorus::test
