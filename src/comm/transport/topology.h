// Which ranks of a communicator share a node: every rank's node identity comes with its
// address in the roster (roster.h), and all ranks derive the same Topology from them.
#pragma once

#include <string>

#include "chorus/store.h"
#include "chorus/topology.h"

namespace chorus::transport {

// This machine's identity: `override_id` when not empty (CHORUS_NODE_ID), else the
// hostname and the kernel's boot id, so that two containers with the same hostname on
// different machines, or a rebooted machine, are told apart.
std::string local_node_id(const std::string& override_id);

// Builds the topology from the node identity of every rank, in rank order.
Topology topology_from_ids(const std::vector<std::string>& ids, int rank);

}  // namespace chorus::transport
