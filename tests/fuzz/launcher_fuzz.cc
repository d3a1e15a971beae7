// libFuzzer target: chorusrun's command-line and environment parsing
// (src/run/options.h) and Slurm host-list expansion (src/run/cluster_env.h).
//
// The input is split at newlines. The first byte picks the mode:
//   even: every line is an argument, except lines "NAME=VALUE" after a line "--env--",
//         which become the environment (CHORUS_RUN_*, SLURM_*, OMPI_* ...);
//   odd:  the rest is one host list for expand_nodelist.
// Parsing must succeed or throw UsageError / HelpRequested; expansion must succeed
// within its limit of hosts or throw UsageError. Anything else is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "run/cluster_env.h"
#include "run/options.h"

namespace run = chorus::run;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "launcher_fuzz: %s\n", what.c_str());
  std::abort();
}

void parse(const std::string& text) {
  std::vector<std::string> args;
  run::Environment env;
  bool in_env = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line == "--env--") {
      in_env = true;
    } else if (in_env) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    } else {
      args.push_back(line);
    }
  }
  try {
    run::LaunchOptions o = run::parse_options(args, env, 2);
    if (o.nproc_per_node < 1 || o.nnodes < 1) fail("accepted a group of no workers");
    if (o.node_rank < 0 || o.node_rank >= o.nnodes) fail("accepted a node rank outside --nnodes");
    if (o.max_restarts < 0) fail("accepted a negative --max-restarts");
    if (o.program.empty()) fail("accepted a command line without a program");
  } catch (const run::UsageError& e) {
    if (std::string(e.what()).empty()) fail("usage error without a message");
  } catch (const run::HelpRequested&) {
  } catch (const run::VersionRequested&) {  // --version before the program: documented
  }
}

void expand(const std::string& list) {
  try {
    std::vector<std::string> hosts = run::expand_nodelist(list);
    if (hosts.size() > 100000) fail("expanded past the limit of hosts");
  } catch (const run::UsageError& e) {
    if (std::string(e.what()).empty()) fail("usage error without a message");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    expand(text);
  } else {
    parse(text);
  }
  return 0;
}
