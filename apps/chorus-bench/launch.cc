#include "launch.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "run/workers.h"

namespace chorus::bench {
namespace {

using std::chrono::milliseconds;

// argv without the launcher's options ("--np N", "--nodes K", or with '='), for the
// ranks; argv[0] is this program's own file.
std::vector<std::string> rank_args(int argc, char** argv) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::vector<std::string> args = {n > 0 ? std::string(self, static_cast<size_t>(n))
                                         : std::string("/proc/self/exe")};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--np" || a == "--nodes") ++i;
    else if (a.rfind("--np=", 0) != 0 && a.rfind("--nodes=", 0) != 0) args.push_back(a);
  }
  return args;
}

// Where rank `rank` of `size` runs: its node and its place there. Without --nodes every
// rank shares this machine's node; with K nodes they are K blocks of consecutive ranks
// (sizes differ by at most one when K does not divide N).
struct Placement {
  int node = -1;  // -1: no simulated node
  int local_rank = 0, local_size = 1;
};

Placement place(int rank, int size, int nodes) {
  if (nodes == 0) return {-1, rank, size};
  // Node n holds ranks [first(n), first(n + 1)): node_of(r) = floor(r * nodes / size).
  auto first = [&](int n) { return (n * size + nodes - 1) / nodes; };
  int node = rank * nodes / size;
  return {node, rank - first(node), first(node + 1) - first(node)};
}

std::vector<run::WorkerSpec> rank_specs(const Options& o, int argc, char** argv,
                                        uint16_t store_port) {
  const std::vector<std::string> args = rank_args(argc, argv);
  const run::Environment base = run::current_environment();
  const std::vector<int> allowed = run::allowed_cpus();
  const std::string port = std::to_string(store_port);
  std::vector<run::WorkerSpec> specs;
  for (int rank = 0; rank < o.np; ++rank) {
    const Placement where = place(rank, o.np, o.nodes);
    run::WorkerSpec s;
    s.rank = rank;
    s.local_rank = where.local_rank;
    s.argv = args;
    s.env = base;
    s.env["RANK"] = std::to_string(rank);
    s.env["LOCAL_RANK"] = std::to_string(where.local_rank);
    s.env["WORLD_SIZE"] = std::to_string(o.np);
    s.env["LOCAL_WORLD_SIZE"] = std::to_string(where.local_size);
    if (where.node >= 0) s.env["CHORUS_NODE_ID"] = "node" + std::to_string(where.node);
    s.env["MASTER_ADDR"] = "127.0.0.1";
    s.env["MASTER_PORT"] = port;
    s.env["CHORUS_STORE_ADDR"] = "127.0.0.1";
    s.env["CHORUS_STORE_PORT"] = port;
    s.env["CHORUS_STORE_HOSTED"] = "1";  // this launcher's, not rank 0's
    s.cpus = run::cpus_for(o.cpu_bind, rank, o.np, allowed);
    specs.push_back(std::move(s));
  }
  return specs;
}

}  // namespace

int launch_local_ranks(const Options& o, int argc, char** argv) {
  // Job token and allow-list: those of the environment, which the ranks inherit.
  TcpStoreServer store("127.0.0.1", 0);
  run::WorkerGroup ranks(run::OutputOptions{});
  ranks.start(rank_specs(o, argc, argv, store.port()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  while (ranks.running() > 0) {
    for (const run::WorkerExit& e : ranks.poll(milliseconds(100))) {
      if (!e.failed()) continue;
      std::fprintf(stderr, "chorus-bench: rank %d ended with %s, stopping the other ranks\n",
                   e.rank, e.describe().c_str());
      ranks.terminate(milliseconds(0));
      return 1;
    }
    if (ranks.running() > 0 && std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "chorus-bench: timed out after %ds, stopping all ranks\n", o.timeout_s);
      ranks.terminate(milliseconds(0));
      return 1;
    }
  }
  return 0;
}

}  // namespace chorus::bench
