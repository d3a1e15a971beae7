#include "chorus/torch/checksum.h"

#include <cstdint>
#include <cstdio>

namespace chorus::torch_ext {

std::string state_checksum(const torch::nn::Module& module, bool with_buffers) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](const at::Tensor& t) {
    const at::Tensor c = t.detach().contiguous();
    const auto* bytes = static_cast<const uint8_t*>(c.data_ptr());
    const int64_t n = c.numel() * static_cast<int64_t>(c.element_size());
    for (int64_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  for (const at::Tensor& p : module.parameters()) add(p);
  if (with_buffers) {
    for (const at::Tensor& b : module.buffers()) add(b);
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace chorus::torch_ext
