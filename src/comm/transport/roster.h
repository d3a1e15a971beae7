// The roster of a communicator: where every rank listens and which node it is on, as
// one record per rank, gathered once at creation.
//
// Every rank publishes its own record in the store; rank 0 alone waits for all of them
// and publishes the roster, one value; every other rank reads that one value. So the
// store sees a constant number of requests from each rank (rank 0's waits are paged,
// store/paged.h) and a rank reads O(size) bytes, where the old start-up had each rank
// read every other's address and node (size requests each, size^2 in all). The roster
// is compact: the distinct strings once, runs of consecutive ranks that share their
// address, host and node as one entry each, and a port per rank.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/store.h"
#include "comm/common/deadline.h"

namespace chorus::transport {

struct Member {
  std::string ip;    // the address it listens on (and publishes)
  uint16_t port = 0;
  std::string host;  // its host name, for messages
  std::string node;  // its node identity (topology.h local_node_id)
  bool operator==(const Member&) const = default;
};

// Collective over the ranks of one communicator (`store` scoped to it): publishes
// `mine` and returns every rank's member, in rank order. Fails on every rank at once
// when the ranks were created with different sizes (naming both sizes and a rank of
// each). Throws TimeoutError at `deadline`: on rank 0 naming the ranks that never
// published (and every other rank then fails with rank 0's words); on the others when
// rank 0 never published the roster. `comm_id` names the communicator in messages.
std::vector<Member> exchange_roster(Store& store, int rank, int size, const Member& mine,
                                    const Deadline& deadline, const std::string& comm_id);

// The store key of rank `rank`'s record (encode_member).
std::string member_key(int rank);

// The encodings (no I/O; the tests and fuzz target call these). decode_* throw
// StoreError saying what was malformed; they never read outside `bytes`.
Bytes encode_member(const Member& member, int size);
Member decode_member(std::span<const uint8_t> bytes, int rank, int* size);
Bytes encode_roster(const std::vector<Member>& members);
std::vector<Member> decode_roster(std::span<const uint8_t> bytes, int size);

}  // namespace chorus::transport
