// Test helpers for the tcp transport, whose streams open on first use (connections by
// use, src/comm/transport/tcp/mesh.cc).
#pragma once

#include <chrono>
#include <cstdint>

#include "chorus/store.h"
#include "comm/transport/transport.h"

namespace chorus::test {

// Collective over every rank of `t`: each sends one byte to every other and receives
// theirs, checked, in an alltoall numbered `seq`. Opens every stream of a tcp transport.
void exchange_with_every_peer(transport::Transport& t, uint64_t seq = 0,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The data port rank `rank` published in the roster (transport/roster.h), once it has.
uint16_t published_port(Store& store, int rank);

}  // namespace chorus::test
