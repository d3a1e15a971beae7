#include "report.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace chorus::bench {
namespace {

const char* buffers_name(const Options& o) { return o.shared_buffers ? "shared" : "ordinary"; }

// The layouts of the table, in nccl-tests' order: out of place, then in place.
bool shows_out(const Options& o) { return o.mode != Mode::kIn; }
bool shows_in(const Options& o) { return o.mode != Mode::kOut; }

void print_result(const std::optional<Result>& r) {
  if (!r) {  // sendrecv in place: no such layout
    std::printf(" %12s %12s %12s %8s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  std::string wrong = r->wrong ? std::to_string(*r->wrong) : "N/A";
  std::printf(" %12.2f %12.3f %12.3f %8s", r->time_us, r->algbw, r->busbw, wrong.c_str());
}

void print_json(const Bench& b, const Row& row, const char* mode, const Result& r) {
  const Options& o = b.options;
  nlohmann::ordered_json j = {{"collective", o.collective}, {"ranks", b.comm.size()},
                              {"size", row.bytes}, {"count", row.count},
                              {"type", dtype_name(o.dtype)},
                              {"redop", b.info.reduces ? op_name(o.op) : "none"},
                              {"algo", row.algo}, {"mode", mode},
                              {"buffers", buffers_name(o)}, {"time_us", r.time_us},
                              {"algbw", r.algbw}, {"busbw", r.busbw}, {"wrong", nullptr}};
  if (r.wrong) j["wrong"] = *r.wrong;
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void print_header(const Bench& b) {
  const Options& o = b.options;
  std::printf("# chorus-bench %s: %d ranks on %d node(s), iters %d, warmup %d, check %d, "
              "buffers %s\n",
              o.collective.c_str(), b.comm.size(), b.comm.topology().nodes, o.iters, o.warmup,
              o.check ? 1 : 0, buffers_name(o));
  // The layouts' names over their four columns (48 characters each, after 48 of size to
  // algo), as nccl-tests labels them.
  std::string layouts(47, ' ');
  if (shows_out(o)) layouts += "  ---------------- out-of-place ----------------";
  if (shows_in(o)) layouts += "  ------------------ in-place ------------------";
  std::printf("#%s\n#%13s %12s %6s %6s %6s", layouts.c_str(), "size(B)", "count", "type", "redop",
              "algo");
  for (int n = shows_out(o) + shows_in(o); n > 0; --n)
    std::printf(" %12s %12s %12s %8s", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  std::printf("\n");
}

void print_row(const Bench& b, const Row& r) {
  const Options& o = b.options;
  if (o.json) {
    if (r.out) print_json(b, r, "out", *r.out);
    if (r.in) print_json(b, r, "in", *r.in);
  } else {
    std::printf("%14zu %12zu %6s %6s %6s", r.bytes, r.count, dtype_name(o.dtype),
                b.info.reduces ? op_name(o.op) : "none", r.algo);
    if (shows_out(o)) print_result(r.out);
    if (shows_in(o)) print_result(r.in);
    std::printf("\n");
  }
  std::fflush(stdout);
}

}  // namespace chorus::bench
