#include "report.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace chorus::bench {

void print_header(const Bench& b) {
  const Options& o = b.options;
  std::printf("# chorus-bench %s: %d ranks on %d node(s), iters %d, warmup %d, check %d\n",
              o.collective.c_str(), b.comm.size(), b.comm.topology().nodes, o.iters, o.warmup,
              o.check ? 1 : 0);
  std::printf("#%13s %12s %6s %6s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
              "redop", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

void print_row(const Bench& b, const Row& r) {
  const Options& o = b.options;
  const char* redop = b.info.reduces ? op_name(o.op) : "none";
  if (o.json) {
    nlohmann::ordered_json j = {{"collective", o.collective}, {"ranks", b.comm.size()},
                        {"size", r.bytes}, {"count", r.count},
                        {"type", dtype_name(o.dtype)}, {"redop", redop},
                        {"algo", r.algo}, {"time_us", r.time_us}, {"algbw", r.algbw},
                        {"busbw", r.busbw}, {"wrong", nullptr}};
    if (r.wrong) j["wrong"] = *r.wrong;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string wrong = r.wrong ? std::to_string(*r.wrong) : "N/A";
    std::printf("%14zu %12zu %6s %6s %6s %12.2f %12.3f %12.3f %8s\n", r.bytes, r.count,
                dtype_name(o.dtype), redop, r.algo, r.time_us, r.algbw, r.busbw,
                wrong.c_str());
  }
  std::fflush(stdout);
}

}  // namespace chorus::bench
