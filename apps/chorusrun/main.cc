// chorusrun: starts and supervises the workers of a chorus job (torchrun's role).
// See src/run/options.h for the command line and src/run/supervisor.h for what it does.
#include <sys/prctl.h>

#include <iostream>
#include <thread>

#include "chorus/version.h"
#include "run/cluster_env.h"
#include "run/options.h"
#include "run/supervisor.h"

int main(int argc, char** argv) {
  using namespace chorus::run;
  std::vector<std::string> args(argv + 1, argv + argc);
  LaunchOptions options;
  try {
    const Environment env = current_environment();
    options = parse_options(args, env,
                            static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    // Before any node waits on the master address: a name that does not resolve fails
    // every node at once, naming it (cluster_env.h).
    settle_master_addr(options, env, system_host_lookup());
  } catch (const HelpRequested&) {
    std::cout << usage_text();
    return 0;
  } catch (const VersionRequested&) {
    std::cout << "chorusrun " << CHORUS_VERSION << "\n";
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "chorusrun: " << e.what() << "\n";
    return 2;
  }
  for (const std::string& warning : options.warnings)
    std::cerr << "chorusrun: warning: " << warning << "\n";
  // Orphaned grandchildren of workers are re-parented to chorusrun, not to init (which
  // does not reap them on every machine): then the process groups of a stopped job
  // really empty out, and none of its processes outlives chorusrun.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return run_job(options);
}
