// A view of a transport restricted to some of its ranks, so that an algorithm written
// for "ranks 0..size-1" can run among a subset of a communicator: the ranks of one
// node, or the ranks with the same local rank on every node (hierarchical algorithms).
//
// The view renumbers: rank i of the view is members[i] of the base, and rank()/size()/
// host_of() answer in the view's numbering. Messages go over the base's streams, so
// they keep the base's ordering and headers (the operation set by the base's begin()),
// and every Request a view returns is the base's own: it can be waited on through the
// view or through the base alike.
//
// The view owns nothing: abort() and close() do not touch the base, because the owner
// of the base (the communicator) decides when its streams end; a failure inside a
// phase surfaces as the exception thrown by wait(), which the communicator turns into
// an abort of the base.
#pragma once

#include <vector>

#include "comm/transport/transport.h"

namespace chorus::transport {

class SubsetTransport : public Transport {
 public:
  // `members`: ascending ranks of `base`, including base.rank(). `base` must outlive
  // the view.
  SubsetTransport(Transport& base, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::string& host_of(int rank) const override;
  // The base rank of view rank `rank`.
  int base_rank(int rank) const { return members_.at(rank); }

  void begin(const OpInfo& op) override { base_.begin(op); }
  Request isend(int peer, const void* data, size_t len) override;
  Request irecv(int peer, void* data, size_t len) override;
  void wait(const Request& request) override { base_.wait(request); }
  bool test(const Request& request) const override { return base_.test(request); }
  // Completes every request posted on the base, not only those of this view: the base
  // cannot tell them apart, and an algorithm that waits for all expects nothing to be
  // pending afterwards anyway.
  void wait_all() override { base_.wait_all(); }
  bool wait_for(const Request* request, std::chrono::microseconds slice) override {
    return base_.wait_for(request, slice);
  }
  void interrupt(const std::string& reason) override { base_.interrupt(reason); }
  // No-ops on the base (see above); later posts through the view throw.
  void abort(const std::string& reason) override { closed_ = true; }
  void close() override { closed_ = true; }

 private:
  int to_base(int peer) const;

  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
  bool closed_ = false;
};

}  // namespace chorus::transport
