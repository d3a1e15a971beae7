#include "run/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <new>

namespace chorus::run {

std::optional<CpuBind> parse_cpu_bind(std::string_view text) {
  if (text == "auto") return CpuBind::kAuto;
  if (text == "none") return CpuBind::kNone;
  if (text == "share") return CpuBind::kShare;
  return std::nullopt;
}

const char* cpu_bind_name(CpuBind bind) {
  switch (bind) {
    case CpuBind::kAuto: return "auto";
    case CpuBind::kNone: return "none";
    case CpuBind::kShare: return "share";
  }
  return "?";
}

std::vector<int> allowed_cpus() {
  // The set may be larger than cpu_set_t's 1024 CPUs: grow until the kernel's fits.
  for (int n = CPU_SETSIZE; n <= (1 << 20); n *= 2) {
    const size_t bytes = CPU_ALLOC_SIZE(n);
    std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set(CPU_ALLOC(n), [](cpu_set_t* s) { CPU_FREE(s); });
    if (!set) return {};
    CPU_ZERO_S(bytes, set.get());
    if (sched_getaffinity(0, bytes, set.get()) != 0) {
      if (errno == EINVAL) continue;
      return {};
    }
    std::vector<int> cpus;
    for (int c = 0; c < n; ++c) {
      if (CPU_ISSET_S(c, bytes, set.get())) cpus.push_back(c);
    }
    return cpus;
  }
  return {};
}

std::vector<int> cpus_for(CpuBind bind, int local_rank, int local_size,
                          const std::vector<int>& allowed) {
  const int n = static_cast<int>(allowed.size());
  if (n == 0 || local_size < 1 || local_rank < 0 || local_rank >= local_size) return {};
  if (bind == CpuBind::kNone || (bind == CpuBind::kAuto && local_size <= n)) return {};
  if (local_size > n) return {allowed[local_rank % n]};
  const int base = n / local_size, extra = n % local_size;
  const int first = local_rank * base + std::min(local_rank, extra);
  const int count = base + (local_rank < extra ? 1 : 0);
  return std::vector<int>(allowed.begin() + first, allowed.begin() + first + count);
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

CpuMask::CpuMask(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  const int count = *std::max_element(cpus.begin(), cpus.end()) + 1;
  bytes_ = CPU_ALLOC_SIZE(count);
  set_.reset(CPU_ALLOC(count), [](cpu_set_t* set) { CPU_FREE(set); });
  if (!set_) throw std::bad_alloc();
  CPU_ZERO_S(bytes_, set_.get());
  for (int cpu : cpus) CPU_SET_S(cpu, bytes_, set_.get());
}

void CpuMask::apply() const {
  if (set_) sched_setaffinity(0, bytes_, set_.get());
}

}  // namespace chorus::run
