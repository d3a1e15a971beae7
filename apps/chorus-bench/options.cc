#include "options.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

namespace chorus::bench {

const std::map<std::string, CollectiveInfo> kCollectives = {
    {"allreduce", {Collective::kAllreduce, true, false, true}},
    {"broadcast", {Collective::kBroadcast, false, false, true}},
    {"reduce", {Collective::kReduce, true, false, true}},
    {"allgather", {Collective::kAllgather, false, true, true}},
    // allgatherv with every count equal: allgather's data through the "v" path.
    {"allgatherv", {Collective::kAllgatherv, false, true, true}},
    {"reduce_scatter", {Collective::kReduceScatter, true, true, true}},
    {"alltoall", {Collective::kAlltoall, false, true, true}},
    // alltoallv with every count equal: alltoall's data through the "v" path, which
    // first checks every pair's counts. In place: the same pointer, as alltoall.
    {"alltoallv", {Collective::kAlltoallv, false, true, true}},
    {"gather", {Collective::kGather, false, true, true}},
    {"scatter", {Collective::kScatter, false, true, true}},
    // Point to point: every rank sends the row's bytes to the next rank and receives as
    // many from the previous one (even ranks send first, odd ranks receive first). No
    // in-place form: the send and the receive are two operations that would race on
    // one buffer.
    {"sendrecv", {Collective::kSend, false, false, false}},
};

namespace {

// A CLI11 check that accepts what `parse` accepts (chorus::parse_dtype/parse_op).
template <class Parse>
CLI::Validator parsed_by(const char* what, Parse parse) {
  return CLI::Validator(
      [=](std::string& text) {
        return parse(text) ? std::string() : "unknown " + std::string(what) + " '" + text + "'";
      },
      what);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "chorus-bench: %s\n", message.c_str());
  std::exit(2);
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  std::string redop = "sum", dtype = "f32", algo;
  int check = 1;
  CLI::App app{"chorus collective benchmark (nccl-tests style)", "chorus-bench"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size, bytes (K/M/G suffixes)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size, bytes (default 256M)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-f,--stepfactor", o.step_factor, "size multiplier")->check(CLI::Range(2, 1 << 20));
  app.add_option("-o,--op", o.collective, "collective")->check(CLI::IsMember(kCollectives));
  app.add_option("-r,--redop", redop, "sum, prod, min, max, avg")
      ->check(parsed_by("REDOP", chorus::parse_op));
  app.add_option("-d,--datatype", dtype, "f32, f64, f16, bf16, i8, u8, i32, i64")
      ->check(parsed_by("TYPE", chorus::parse_dtype));
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1 << 30));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations")->check(CLI::Range(0, 1 << 30));
  app.add_option("-c,--check", check, "verify results (0/1)")->check(CLI::Range(0, 1));
  app.add_option("-a,--algo", algo, "auto, ring, rd, hd, shm, hier, tree (default: CHORUS_ALGO)")
      ->check(parsed_by("algorithm", [](const std::string& t) { return chorus::parse_algorithm(t); }));
  app.add_option("--np", o.np, "start N local ranks on 127.0.0.1")->check(CLI::Range(1, 1024));
  app.add_option("--nodes", o.nodes,
                 "with --np: split the ranks into K simulated nodes of consecutive ranks "
                 "(CHORUS_NODE_ID=node<i>)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--timeout", o.timeout_s, "deadline of an --np run, seconds (default 900)")
      ->check(CLI::Range(1, 7 * 24 * 3600));
  std::string cpu_bind = "auto";
  app.add_option("--cpu-bind", cpu_bind,
                 "with --np: bind the ranks to CPUs as chorusrun does: auto (only when they "
                 "outnumber the CPUs), share, none")
      ->check(parsed_by("POLICY", run::parse_cpu_bind));
  std::string mode = "both", buffers = "ordinary";
  app.add_option("-m,--mode", mode,
                 "out: send and receive in separate buffers; in: in place, in one buffer "
                 "(the layouts of communicator.h: allgather's send at recv + rank*count, "
                 "reduce_scatter's recv at send + rank*recv_count, gather's and scatter's "
                 "at the rank's block, the same pointer otherwise); both (default): "
                 "out-of-place and in-place columns side by side. sendrecv has no in-place "
                 "form: both measures it out of place only")
      ->check(CLI::IsMember({"out", "in", "both"}));
  app.add_option("--buffers", buffers,
                 "ordinary (default): heap memory; shared: node-shared memory from "
                 "chorus::allocate_shared, whose collectives may take the direct path "
                 "(shared_memory.h)")
      ->check(CLI::IsMember({"ordinary", "shared"}));
  app.add_flag("--json", o.json,
               "print rows as JSON lines, one per size and mode: collective, ranks, size, "
               "count, type, redop, algo, mode (\"out\" or \"in\"), buffers, time_us, "
               "algbw, busbw, wrong (null without --check)");
  app.set_version_flag("--version", std::string("chorus-bench ") + CHORUS_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  if (o.min_bytes == 0) usage_error("--minbytes must be at least 1");
  if (o.min_bytes > o.max_bytes) usage_error("--minbytes must not exceed --maxbytes");
  if (o.nodes > 0 && o.np == 0) usage_error("--nodes needs --np");
  if (o.nodes > o.np) usage_error("--nodes must not exceed --np");
  o.op = *chorus::parse_op(redop);
  o.dtype = *chorus::parse_dtype(dtype);
  o.check = check == 1;
  o.cpu_bind = *run::parse_cpu_bind(cpu_bind);
  if (!algo.empty()) o.algorithm = *chorus::parse_algorithm(algo);
  o.mode = mode == "out" ? Mode::kOut : mode == "in" ? Mode::kIn : Mode::kBoth;
  o.shared_buffers = buffers == "shared";
  if (o.mode == Mode::kIn && !kCollectives.at(o.collective).in_place)
    usage_error("--mode in: " + o.collective + " has no in-place form");
  return o;
}

}  // namespace chorus::bench
