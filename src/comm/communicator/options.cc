#include "chorus/communicator.h"
#include "chorus/error.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/communicator/cost_model.h"
#include "comm/reduce/reduce.h"

namespace chorus {

namespace {
// CHORUS_ALGO's value; ConfigError naming the names the table knows.
Algorithm algorithm_from_env(const std::string& name) {
  if (std::optional<Algorithm> a = parse_algorithm(name)) return *a;
  std::string names;
  for (int v = 0; v < 256; ++v) {
    const char* n = algorithm_name(static_cast<Algorithm>(v));
    if (std::string(n) != "?") names += std::string(names.empty() ? "" : ", ") + n;
  }
  throw ConfigError("CHORUS_ALGO='" + name + "' is not one of " + names);
}

TransportKind parse_transport(const std::string& name) {
  if (name == "tcp") return TransportKind::kTcp;
  if (name == "shm") return TransportKind::kShm;
  return TransportKind::kAuto;
}
}  // namespace

CommOptions CommOptions::from_env() {
  CommOptions o;
  // Read for their checks only: logging and the reduction kernels take them themselves,
  // where a bad value could only be logged.
  settings::log_level();
  parse_reduce_isa(settings::reduce_isa());
  o.timeout = settings::op_timeout();
  o.connect_timeout = settings::connect_timeout();
  o.algorithm = algorithm_from_env(settings::algorithm());
  o.transport = parse_transport(settings::transport());
  o.shm_direct = settings::shm_direct();
  o.shm_inline = settings::shm_inline();
  const int cma = settings::shm_cma();
  o.shm_cma = cma == 2 ? CrossMemoryAttach::kAnyNode : cma == 1 ? CrossMemoryAttach::kPairs
                                                           : CrossMemoryAttach::kOff;
  o.cost_model = settings::cost_model();
  if (auto file = settings::allowlist_file()) {
    o.allowlist_file = file->path;
    o.allowlist_source = file->variable;
  }
  communicator::parse_cost_params(o.cost_model);  // a bad value fails here, naming the variable
  o.node_id = settings::node_id();
  o.check_consistency = settings::debug_detail();
  o.trace_buffer_size = static_cast<size_t>(settings::trace_buffer_size());
  o.trace_dir = settings::trace_dir();
  if (auto v = settings::segment_bytes()) o.segment_bytes = static_cast<size_t>(*v);
  o.job_token = settings::job_token();
  o.listen_address = settings::if_ip();
  if (o.listen_address.empty()) {
    std::string patterns = settings::socket_ifname();
    if (!patterns.empty()) {
      o.listen_address = net::address_for_interfaces(
          patterns, settings::get_env("CHORUS_SOCKET_IFNAME") ? "CHORUS_SOCKET_IFNAME"
                                                              : "HCCL_SOCKET_IFNAME");
    }
  }
  return o;
}

}  // namespace chorus
