// Shared by the transport suites: the shared-memory group of `size` local ranks of a
// test, meeting in a store as a communicator's would.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "chorus/store.h"
#include "comm/transport/shm/shm_group.h"

namespace chorus {

// A group of `size` local ranks meeting in `store`, as a communicator's would, trying
// cross-memory attach as told.
inline std::unique_ptr<transport::shm::ShmGroup> connect_group(Store& store, int rank, int size,
                                                        bool try_cma = false,
                                                        bool cma_any_size = false) {
  transport::shm::GroupConfig config;
  config.rank = rank;
  for (int r = 0; r < size; ++r) {
    config.members.push_back(r);
    config.hosts.push_back("h" + std::to_string(r));
  }
  config.buffer_bytes = 64 * 1024;
  config.try_cma = try_cma;
  config.cma_any_size = cma_any_size;
  std::string why_not;
  auto group = transport::shm::ShmGroup::connect(store, config, why_not);
  if (!group) throw std::runtime_error("shm group: " + why_not);
  return group;
}

}  // namespace chorus
