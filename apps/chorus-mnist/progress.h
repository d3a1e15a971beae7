// chorus-mnist's progress bar (rank 0, when stdout is a terminal): one line, redrawn
// in place with '\r', e.g.
//
//   epoch 1/2 [##########----------]  59/117 loss 0.5123  2345 samples/s ETA 0:42
//
// render_progress builds the line from numbers only, so that it can be tested.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace chorus::mnist {

struct Progress {
  int64_t epoch = 0, epochs = 1;  // epoch counts from 0; shown from 1
  int64_t step = 0, steps = 0;    // steps done in this epoch, of `steps` (0: unknown)
  double loss = 0;
  double samples_per_second = 0;  // 0: not measured yet
  double eta_seconds = -1;        // time left for the whole run; < 0: unknown
};

// "M:SS", or "H:MM:SS" from an hour on; "--:--" when unknown (negative or not finite).
inline std::string format_eta(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "--:--";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return buf;
}

// The bar's line, without '\r' or a newline; `bar_width` cells of '#' (done) and '-'.
inline std::string render_progress(const Progress& p, int bar_width = 20) {
  const double done = p.steps > 0 ? std::clamp(static_cast<double>(p.step) / p.steps, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(done * bar_width);
  std::string bar = "[";
  bar.append(filled, '#').append(bar_width - filled, '-').append("]");
  char head[64], steps[64], rate[48];
  std::snprintf(head, sizeof head, "epoch %lld/%lld ", static_cast<long long>(p.epoch + 1),
                static_cast<long long>(p.epochs));
  const int digits = p.steps > 0 ? static_cast<int>(std::to_string(p.steps).size()) : 1;
  if (p.steps > 0) {
    std::snprintf(steps, sizeof steps, " %*lld/%lld", digits, static_cast<long long>(p.step),
                  static_cast<long long>(p.steps));
  } else {
    std::snprintf(steps, sizeof steps, " %lld", static_cast<long long>(p.step));
  }
  if (p.samples_per_second > 0) {
    std::snprintf(rate, sizeof rate, " %6.0f samples/s", p.samples_per_second);
  } else {
    std::snprintf(rate, sizeof rate, " %6s samples/s", "-");
  }
  char loss[32];
  std::snprintf(loss, sizeof loss, " loss %.4f", p.loss);
  return head + bar + steps + loss + rate + " ETA " + format_eta(p.eta_seconds);
}

}  // namespace chorus::mnist
