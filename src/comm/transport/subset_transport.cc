#include "comm/transport/subset_transport.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "chorus/error.h"

namespace chorus::transport {

SubsetTransport::SubsetTransport(Transport& base, std::vector<int> members)
    : base_(base), members_(std::move(members)) {
  // A programming error of the caller, not a runtime condition: the algorithms build
  // the member lists from the topology.
  if (!std::is_sorted(members_.begin(), members_.end()) ||
      std::adjacent_find(members_.begin(), members_.end()) != members_.end()) {
    throw std::logic_error("SubsetTransport: members must be ascending and distinct");
  }
  for (int m : members_) {
    if (m < 0 || m >= base_.size()) {
      throw std::logic_error("SubsetTransport: member " + std::to_string(m) +
                             " is not a rank of the base transport");
    }
  }
  auto it = std::lower_bound(members_.begin(), members_.end(), base_.rank());
  if (it == members_.end() || *it != base_.rank()) {
    throw std::logic_error("SubsetTransport: this rank is not a member");
  }
  rank_ = static_cast<int>(it - members_.begin());
}

const std::string& SubsetTransport::host_of(int rank) const {
  return base_.host_of(members_.at(rank));
}

int SubsetTransport::to_base(int peer) const {
  if (closed_) throw AbortedError("subset transport: used after abort() or close()");
  if (peer < 0 || peer >= size()) {
    throw std::logic_error("SubsetTransport: peer " + std::to_string(peer) +
                           " is out of range [0, " + std::to_string(size()) + ")");
  }
  return members_[peer];
}

Request SubsetTransport::isend(int peer, const void* data, size_t len) {
  return base_.isend(to_base(peer), data, len);
}

Request SubsetTransport::irecv(int peer, void* data, size_t len) {
  return base_.irecv(to_base(peer), data, len);
}

}  // namespace chorus::transport
