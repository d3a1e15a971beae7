#include "comm/transport/topology.h"

#include <unistd.h>

#include <fstream>
#include <map>

namespace chorus {

bool Topology::uniform() const {
  if (node_ranks.empty()) return false;
  size_t per_node = node_ranks[0].size();
  for (const std::vector<int>& ranks : node_ranks) {
    if (ranks.size() != per_node) return false;
  }
  return true;
}

namespace transport {

std::string local_node_id(const std::string& override_id) {
  if (!override_id.empty()) return override_id;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(host) + "/" + boot_id;
}

Topology topology_from_ids(const std::vector<std::string>& ids, int rank) {
  Topology t;
  std::map<std::string, int> node_index;
  t.node_of.resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    auto [it, added] = node_index.emplace(ids[r], static_cast<int>(t.node_ranks.size()));
    if (added) t.node_ranks.emplace_back();
    t.node_of[r] = it->second;
    t.node_ranks[it->second].push_back(static_cast<int>(r));
  }
  t.nodes = static_cast<int>(t.node_ranks.size());
  t.node = t.node_of[rank];
  const std::vector<int>& mine = t.node_ranks[t.node];
  t.local_size = static_cast<int>(mine.size());
  for (int i = 0; i < t.local_size; ++i) {
    if (mine[i] == rank) t.local_rank = i;
  }
  return t;
}

}  // namespace transport
}  // namespace chorus
