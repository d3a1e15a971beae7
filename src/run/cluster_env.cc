#include "run/cluster_env.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "chorus/error.h"
#include "comm/common/socket.h"

namespace chorus::run {
namespace {

constexpr uint64_t kMaxHosts = 100000;
// Enough digits for any host number, few enough that a range's size fits in uint64_t.
constexpr size_t kMaxDigits = 18;

// A numbered part of a host name: first..last, printed with at least `width` digits.
struct NumberRange {
  uint64_t first = 0;
  uint64_t last = 0;
  size_t width = 0;
};

// A piece of one host-list item: literal text, or a bracket group (ranges not empty).
struct Piece {
  std::string literal;
  std::vector<NumberRange> ranges;
};
using Item = std::vector<Piece>;

// Long lists are shortened in messages; the start is enough to find the mistake.
std::string shown(std::string_view list) {
  constexpr size_t kShown = 200;
  if (list.size() <= kShown) return std::string(list);
  return std::string(list.substr(0, kShown)) + "...";
}

[[noreturn]] void bad_list(std::string_view list, const std::string& why) {
  throw UsageError("host list \"" + shown(list) + "\": " + why);
}

// Splits at commas outside brackets, checking that brackets pair up and do not nest.
std::vector<std::string_view> split_items(std::string_view list) {
  std::vector<std::string_view> items;
  size_t start = 0;
  bool in_group = false;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[' && in_group) bad_list(list, "nested '[' at position " + std::to_string(i));
    if (c == ']' && !in_group) bad_list(list, "']' without '[' at position " + std::to_string(i));
    if (c == '[' || c == ']') in_group = (c == '[');
    if (c != ',' || in_group) continue;
    if (i == start) bad_list(list, "empty item at position " + std::to_string(i));
    items.push_back(list.substr(start, i - start));
    start = i + 1;
  }
  if (in_group) bad_list(list, "'[' without ']'");
  return items;
}

uint64_t parse_number(std::string_view list, std::string_view digits) {
  uint64_t value = 0;
  bool all_digits = !digits.empty() && digits.find_first_not_of("0123456789") == digits.npos;
  if (!all_digits) bad_list(list, "\"" + std::string(digits) + "\" is not a number");
  if (digits.size() > kMaxDigits) bad_list(list, "number " + std::string(digits) + " is too long");
  std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return value;
}

// "7", "07" or "01-03": the width of the first number is kept, so "01-03" gives 01 02 03.
NumberRange parse_range(std::string_view list, std::string_view text) {
  size_t dash = text.find('-');
  std::string_view first = text.substr(0, dash);
  std::string_view last = dash == text.npos ? first : text.substr(dash + 1);
  NumberRange range{parse_number(list, first), parse_number(list, last), first.size()};
  if (range.first > range.last) bad_list(list, "range " + std::string(text) + " is reversed");
  return range;
}

// The inside of one bracket group: "01-03,07".
std::vector<NumberRange> parse_group(std::string_view list, std::string_view group) {
  if (group.empty()) bad_list(list, "empty brackets []");
  std::vector<NumberRange> ranges;
  size_t start = 0;
  while (true) {
    size_t comma = group.find(',', start);
    ranges.push_back(parse_range(list, group.substr(start, comma - start)));
    if (comma == group.npos) return ranges;
    start = comma + 1;
  }
}

// An item from split_items, so its brackets are known to pair up.
Item parse_item(std::string_view list, std::string_view text) {
  Item item;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t open = text.find('[', pos);
    if (open != pos) {
      item.push_back({std::string(text.substr(pos, open - pos)), {}});
      if (open == text.npos) break;
    }
    size_t close = text.find(']', open);
    item.push_back({"", parse_group(list, text.substr(open + 1, close - open - 1))});
    pos = close + 1;
  }
  return item;
}

// Saturates at kMaxHosts + 1: only "too many" matters beyond the limit.
uint64_t bounded_add(uint64_t a, uint64_t b) { return std::min(a + b, kMaxHosts + 1); }
uint64_t bounded_multiply(uint64_t a, uint64_t b) {
  return (a != 0 && b > (kMaxHosts + 1) / a) ? kMaxHosts + 1 : std::min(a * b, kMaxHosts + 1);
}

uint64_t count_hosts(const Item& item) {
  uint64_t hosts = 1;
  for (const Piece& piece : item) {
    uint64_t choices = piece.ranges.empty() ? 1 : 0;
    for (const NumberRange& range : piece.ranges) {
      // Each range size is below 10^18 (kMaxDigits), so the sum cannot wrap.
      choices = bounded_add(choices, range.last - range.first + 1);
    }
    hosts = bounded_multiply(hosts, choices);
  }
  return hosts;
}

std::string padded(uint64_t number, size_t width) {
  std::string digits = std::to_string(number);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Cartesian product of the pieces, leftmost varying slowest: r[1-2]n[3-4] gives
// r1n3 r1n4 r2n3 r2n4, as Slurm orders them.
void append_hosts(const Item& item, std::vector<std::string>& hosts) {
  std::vector<std::string> names{""};
  for (const Piece& piece : item) {
    std::vector<std::string> longer;
    for (const std::string& name : names) {
      if (piece.ranges.empty()) longer.push_back(name + piece.literal);
      for (const NumberRange& range : piece.ranges) {
        for (uint64_t n = range.first; n <= range.last; ++n) {
          longer.push_back(name + padded(n, range.width));
        }
      }
    }
    names = std::move(longer);
  }
  hosts.insert(hosts.end(), names.begin(), names.end());
}

std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// The first of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> first_set(
    const Environment& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = lookup(env, name)) return std::make_pair(std::string(name), *value);
  }
  return std::nullopt;
}

int whole_number(const std::string& name, const std::string& text, int min) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min) {
    throw UsageError(name + "=" + text + ": must be a whole number >= " + std::to_string(min));
  }
  return value;
}

// Reads `names` (first set wins) as a whole number >= min into `field`.
void read_number(const Environment& env, std::initializer_list<const char*> names, int min,
                 const std::string& key, std::optional<int>& field, ClusterInfo& info) {
  auto found = first_set(env, names);
  if (!found) return;
  field = whole_number(found->first, found->second, min);
  info.source[key] = found->first;
}

// `names` as a whole number >= min, with the variable it came from; empty when unset.
std::optional<std::pair<std::string, int>> number_of(const Environment& env,
                                                     std::initializer_list<const char*> names,
                                                     int min) {
  auto found = first_set(env, names);
  if (!found) return std::nullopt;
  return std::make_pair(found->first, whole_number(found->first, found->second, min));
}

void read_slurm_master(const Environment& env, ClusterInfo& info) {
  auto found = first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!found) return;
  try {
    // Expanding the whole list (bounded) also checks it, not just its first item.
    info.master_addr = expand_nodelist(found->second).front();
  } catch (const UsageError& e) {
    throw UsageError(found->first + ": " + e.what());
  }
  info.source["master_addr"] = found->first;
}

// A count in a tasks-per-node value: a whole number >= 0.
std::optional<int> task_count(std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

// The largest count of Slurm's tasks-per-node form "2(x3),1" (two tasks on each of three
// nodes, then one).
int most_tasks_on_a_node(const std::string& name, const std::string& text) {
  int most = 0;
  for (size_t start = 0; start <= text.size();) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item(text.data() + start, comma - start);
    size_t repeat = item.find("(x");
    std::optional<int> tasks = task_count(item.substr(0, repeat));
    bool repeat_ok = repeat == item.npos ||
                     (item.back() == ')' &&
                      task_count(item.substr(repeat + 2, item.size() - repeat - 3)).has_value());
    if (!tasks || !repeat_ok) {
      throw UsageError(name + "=" + text + ": must be task counts such as 2(x3),1");
    }
    most = std::max(most, *tasks);
    start = comma + 1;
  }
  return most;
}

std::string one_launcher_per_node() {
  return "start one chorusrun per node (srun --ntasks-per-node=1 chorusrun ..., or sbatch "
         "--ntasks-per-node=1; with -n, -n equal to -N) and give the workers per node "
         "with --nproc-per-node";
}

// Under srun (SLURM_STEP_ID set) every task is one chorusrun and Slurm numbers nodes,
// not tasks: two tasks on one node would both be that node (the same SLURM_NODEID), one
// failing on the store's port while the other trains alone. In the batch script (no
// step) chorusrun runs on the job's first node only, which is fine for one node and a
// wait for launchers that never come for more.
std::string slurm_refusal(const Environment& env, const ClusterInfo& info) {
  bool in_step = first_set(env, {"SLURM_STEP_ID", "SLURM_STEPID"}).has_value();
  if (!in_step) {
    if (info.nnodes.value_or(1) == 1) return "";
    return "chorusrun runs in the batch script of a job of " + std::to_string(*info.nnodes) +
           " nodes (" + info.source.at("nnodes") + "), which runs on the job's first node " +
           "only, so the other nodes' launchers would never come: " + one_launcher_per_node();
  }
  std::string evidence;
  if (auto per_node = first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    if (most_tasks_on_a_node(per_node->first, per_node->second) > 1) {
      evidence = per_node->first + "=" + per_node->second;
    }
  }
  auto tasks = number_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, 1);
  auto nodes = number_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, 1);
  if (evidence.empty() && tasks && nodes && tasks->second > nodes->second) {
    evidence = tasks->first + "=" + std::to_string(tasks->second) + " > " + nodes->first + "=" +
               std::to_string(nodes->second);
  }
  auto ntasks_per_node = number_of(env, {"SLURM_NTASKS_PER_NODE"}, 0);
  if (evidence.empty() && ntasks_per_node && ntasks_per_node->second > 1) {
    evidence = "SLURM_NTASKS_PER_NODE=" + std::to_string(ntasks_per_node->second);
  }
  auto local_id = number_of(env, {"SLURM_LOCALID"}, 0);
  if (evidence.empty() && local_id && local_id->second > 0) {
    evidence = "SLURM_LOCALID=" + std::to_string(local_id->second);
  }
  if (evidence.empty()) return "";
  return "srun started more than one task on a node (" + evidence + "), and each would be " +
         "a chorusrun claiming the whole node: " + one_launcher_per_node();
}

ClusterInfo slurm(const Environment& env, const std::string& job_id) {
  ClusterInfo info;
  info.scheduler = "slurm";
  read_number(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1, "nnodes",
              info.nnodes, info);
  read_number(env, {"SLURM_NODEID"}, 0, "node_rank", info.node_rank, info);
  read_slurm_master(env, info);
  info.job_id = job_id;
  info.source["rdzv_id"] = "SLURM_JOB_ID";
  info.master_port = slurm_port(job_id);
  info.source["master_port"] = "SLURM_JOB_ID";
  info.refusal = slurm_refusal(env, info);
  return info;
}

// Open MPI does not say where rank 0 runs, so master_addr stays unset; it does say how
// many of the launchers share this host.
ClusterInfo open_mpi(const Environment& env) {
  ClusterInfo info;
  info.scheduler = "mpirun";
  read_number(env, {"OMPI_COMM_WORLD_SIZE"}, 1, "nnodes", info.nnodes, info);
  read_number(env, {"OMPI_COMM_WORLD_RANK"}, 0, "node_rank", info.node_rank, info);
  auto local = number_of(env, {"OMPI_COMM_WORLD_LOCAL_SIZE"}, 1);
  int size = info.nnodes.value_or(1);
  info.several_hosts = local ? local->second < size : size > 1;
  info.hosts_evidence = local ? "OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(local->second) +
                                    " of OMPI_COMM_WORLD_SIZE=" + std::to_string(size)
                              : "OMPI_COMM_WORLD_SIZE=" + std::to_string(size) +
                                    " and no OMPI_COMM_WORLD_LOCAL_SIZE";
  return info;
}

}  // namespace

std::optional<ClusterInfo> detect_cluster(const Environment& env) {
  if (lookup(env, "OMPI_COMM_WORLD_SIZE")) return open_mpi(env);
  if (auto job_id = lookup(env, "SLURM_JOB_ID")) return slurm(env, *job_id);
  return std::nullopt;
}

std::vector<std::string> expand_nodelist(const std::string& list) {
  if (list.empty()) bad_list(list, "empty");
  std::vector<Item> items;
  uint64_t total = 0;
  for (std::string_view text : split_items(list)) {
    items.push_back(parse_item(list, text));
    total = bounded_add(total, count_hosts(items.back()));
    // Checked before anything is generated: "n[1-99999999]" must not exhaust memory.
    if (total > kMaxHosts) bad_list(list, "more than " + std::to_string(kMaxHosts) + " hosts");
  }
  std::vector<std::string> hosts;
  hosts.reserve(total);
  for (const Item& item : items) append_hosts(item, hosts);
  return hosts;
}

uint16_t slurm_port(const std::string& job_id) {
  uint64_t number = 0;
  auto [end, error] = std::from_chars(job_id.data(), job_id.data() + job_id.size(), number);
  if (error != std::errc() || end != job_id.data() + job_id.size()) {
    number = 14695981039346656037ull;  // FNV-1a
    for (unsigned char c : job_id) number = (number ^ c) * 1099511628211ull;
  }
  return static_cast<uint16_t>(kSlurmPortBase + number % kSlurmPorts);
}

namespace {

bool resolves_here(const std::string& host) {
  try {
    return !net::resolve(host, 0).empty();
  } catch (const SystemError&) {
    return false;
  }
}

// NodeAddr=... from `scontrol show node -o NAME`. `timeout` bounds the wait for a
// controller that does not answer (scontrol's own retries take about a minute). The
// name has passed the host check of the options (letters, digits, . - _ : %), so it
// needs no quoting beyond the single quotes.
std::optional<std::string> scontrol_node_addr(const std::string& name) {
  if (name.empty() || name.front() == '-') return std::nullopt;
  std::string command = "timeout -k 1 5 scontrol show node -o '" + name + "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0 && out.size() < (1u << 20)) {
    out.append(buffer, n);
  }
  if (::pclose(pipe) != 0) return std::nullopt;
  const std::string key = " NodeAddr=";
  size_t at = out.find(key);
  if (at == std::string::npos) return std::nullopt;
  size_t start = at + key.size();
  std::string addr = out.substr(start, out.find_first_of(" \n", start) - start);
  if (addr.empty()) return std::nullopt;
  return addr;
}

}  // namespace

HostLookup system_host_lookup() { return {resolves_here, scontrol_node_addr}; }

void settle_master_addr(LaunchOptions& options, const Environment& env, const HostLookup& hosts) {
  const std::string name = options.master_addr;
  if (hosts.resolves(name)) return;
  auto it = options.source.find("master_addr");
  const std::string source = it == options.source.end() ? std::string("default") : it->second;
  std::string why;
  if (source.rfind("SLURM_", 0) == 0) {
    std::optional<std::string> node_addr = hosts.slurm_node_addr(name);
    if (node_addr && *node_addr != name && hosts.resolves(*node_addr)) {
      options.master_addr = *node_addr;
      options.source["master_addr"] = "NodeAddr of " + name + " (scontrol show node)";
      return;
    }
    std::optional<std::string> launch = lookup(env, "SLURM_LAUNCH_NODE_IPADDR");
    if (launch && hosts.resolves(*launch)) {
      options.master_addr = *launch;
      options.source["master_addr"] = "SLURM_LAUNCH_NODE_IPADDR";
      options.warnings.push_back(
          "the master host '" + name + "' (first host of " + source +
          ") does not resolve here and Slurm gave no address for it; using "
          "SLURM_LAUNCH_NODE_IPADDR=" + *launch + ", the host srun runs on, which is node 0 "
          "only when srun runs on the job's first node (as in a batch script); else give "
          "--master-addr");
      return;
    }
    why = ", Slurm gave no NodeAddr for it (scontrol show node) and SLURM_LAUNCH_NODE_IPADDR " +
          std::string(launch ? "does not resolve either" : "is not set");
  }
  std::string from = source == "default" ? "the default" : source;
  if (source.rfind("SLURM_", 0) == 0) from = "first host of " + source;
  throw UsageError("cannot resolve the master address '" + name + "' (" + from +
                   ") on this node (host " + net::hostname() + ")" + why +
                   ": every node must reach node 0's store there; give --master-addr with an "
                   "address every node resolves (an IP address, or a name in DNS or /etc/hosts)");
}

}  // namespace chorus::run
