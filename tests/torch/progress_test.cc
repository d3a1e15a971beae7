// chorus-mnist's progress bar line (apps/chorus-mnist/progress.h), from numbers.
#include <gtest/gtest.h>

#include "progress.h"

namespace chorus::mnist {
namespace {

TEST(Progress, RendersEpochBarStepsLossRateAndEta) {
  Progress p;
  p.epoch = 0;
  p.epochs = 2;
  p.step = 59;
  p.steps = 117;
  p.loss = 0.51234;
  p.samples_per_second = 2345.4;
  p.eta_seconds = 42.4;
  EXPECT_EQ(render_progress(p), "epoch 1/2 [##########----------]  59/117 loss 0.5123   2345 samples/s ETA 0:42");
  p.step = 117;
  p.eta_seconds = 3725;
  EXPECT_EQ(render_progress(p, 4), "epoch 1/2 [####] 117/117 loss 0.5123   2345 samples/s ETA 1:02:05");
}

TEST(Progress, UnknownRateEtaAndStepCount) {
  Progress p;
  p.epoch = 2;
  p.epochs = 5;
  p.step = 3;
  p.loss = 2.3;
  EXPECT_EQ(render_progress(p, 4), "epoch 3/5 [----] 3 loss 2.3000      - samples/s ETA --:--");
}

TEST(Progress, BarIsClampedAndEtaFormats) {
  Progress p;
  p.step = 500;
  p.steps = 100;
  EXPECT_EQ(render_progress(p, 3).substr(0, 14), "epoch 1/1 [###");
  EXPECT_EQ(format_eta(0), "0:00");
  EXPECT_EQ(format_eta(59.6), "1:00");
  EXPECT_EQ(format_eta(3600), "1:00:00");
  EXPECT_EQ(format_eta(-1), "--:--");
  EXPECT_EQ(format_eta(1.0 / 0.0), "--:--");
}

}  // namespace
}  // namespace chorus::mnist
