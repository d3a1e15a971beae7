#include "run/cluster_env.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

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

void read_slurm_master(const Environment& env, ClusterInfo& info) {
  auto found = first_set(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!found) return;
  try {
    // Expanding the whole list (bounded) also checks it, not just its first item.
    info.master_addr = expand_nodelist(found->second).front();
  } catch (const UsageError& e) {
    throw UsageError(found->first + ": " + e.what());
  }
  info.source["master_addr"] = found->first;
}

ClusterInfo slurm(const Environment& env, const std::string& job_id) {
  ClusterInfo info;
  info.scheduler = "slurm";
  read_number(env, {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1, "nnodes", info.nnodes, info);
  read_number(env, {"SLURM_NODEID"}, 0, "node_rank", info.node_rank, info);
  read_slurm_master(env, info);
  info.job_id = job_id;
  info.source["rdzv_id"] = "SLURM_JOB_ID";
  return info;
}

// Open MPI does not say where rank 0 runs, so master_addr stays unset.
ClusterInfo open_mpi(const Environment& env) {
  ClusterInfo info;
  info.scheduler = "mpirun";
  read_number(env, {"OMPI_COMM_WORLD_SIZE"}, 1, "nnodes", info.nnodes, info);
  read_number(env, {"OMPI_COMM_WORLD_RANK"}, 0, "node_rank", info.node_rank, info);
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

}  // namespace chorus::run
