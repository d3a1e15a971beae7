// Binding workers to CPUs, as mpirun does: chorusrun --cpu-bind and chorus-bench's own
// ranks. A worker's affinity is set between fork and exec, so that every thread it
// starts (its progress thread, libtorch's pools) inherits it.
//
// Why: with more ranks on a node than CPUs, the kernel's load balancing can leave three
// of four ranks on one of two CPUs for the whole run (it does not move a task that ran
// within the last half millisecond), and every collective then waits for that CPU.
// Measured with chorus-bench, allreduce of 64 KiB, 4 ranks on 2 CPUs, two runs each
// in the same minutes: 41.6 and 44.5 us per operation unbound, 27.0 and 27.6 us bound
// (a traced unbound run as slow had three ranks on one CPU from start to end).
#pragma once

#include <sched.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::run {

enum class CpuBind : uint8_t {
  kAuto,   // kShare when a node has more workers than usable CPUs, else kNone
  kNone,   // workers keep the launcher's affinity
  kShare,  // each worker gets its own share of the launcher's CPUs
};

// "auto", "none" or "share"; nullopt for anything else.
std::optional<CpuBind> parse_cpu_bind(std::string_view text);
const char* cpu_bind_name(CpuBind bind);

// The CPUs the calling thread may run on (sched_getaffinity), ascending; empty when the
// kernel does not say.
std::vector<int> allowed_cpus();

// The CPUs local rank `local_rank` of `local_size` is bound to, chosen from `allowed`
// (ascending); empty: leave it unbound (kNone, kAuto without more workers than CPUs,
// or nothing allowed known).
//   kShare with at least as many CPUs as workers: `allowed` cut into local_size runs of
//   neighbouring CPUs, the first allowed.size() % local_size one CPU longer;
//   with more workers than CPUs: local rank i gets allowed[i % allowed.size()] alone,
//   so that the ranks sharing a CPU are spread evenly.
std::vector<int> cpus_for(CpuBind bind, int local_rank, int local_size,
                          const std::vector<int>& allowed);

// "0-3,8,10-11" for ascending `cpus`.
std::string cpu_list(const std::vector<int>& cpus);

// A set of CPUs to bind a child process to: made before fork() (it allocates), applied
// in the child between fork and exec, where only async-signal-safe calls are allowed.
class CpuMask {
 public:
  // Empty `cpus` (or none): apply() leaves the affinity as it is. Throws std::bad_alloc.
  CpuMask() = default;
  explicit CpuMask(const std::vector<int>& cpus);
  // Binds the calling thread (in a child before exec: the whole worker, whose threads
  // inherit it). A binding the kernel refuses (a CPU gone from the launcher's cpuset
  // meanwhile) is skipped: it only helps speed.
  void apply() const;

 private:
  std::shared_ptr<cpu_set_t> set_;
  size_t bytes_ = 0;
};

}  // namespace chorus::run
