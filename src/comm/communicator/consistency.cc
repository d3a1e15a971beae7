// CHORUS_DEBUG=DETAIL: before each collective runs, every rank's fingerprint of it is
// gathered over tcp and compared, so that ranks that disagree fail naming every call.
#include <algorithm>

#include "chorus/error.h"
#include "comm/algorithms/algorithms.h"
#include "comm/communicator/communicator_impl.h"

namespace chorus::communicator {

namespace {

// What CHORUS_DEBUG=DETAIL compares: fixed size, so that the exchange itself matches
// on every rank whatever each one is about to run. The call's signature is the one the
// transports compare (transport.h), so a valid allgatherv or alltoallv, whose send
// counts differ between ranks, agrees here too.
struct Fingerprint {
  uint64_t seq = 0;
  transport::Signature sig;
  uint8_t code = 0;
  bool operator==(const Fingerprint&) const = default;
};

std::string describe(const Fingerprint& f) {
  return transport::describe_call(f.code, nullptr, f.seq, false, f.sig);
}

}  // namespace

void CommunicatorImpl::check_consistency(const Op& op, const transport::OpInfo& op_info) {
  transport::OpInfo info;
  info.name = "consistency check";
  info.code = transport::kConsistencyCheckCode;
  info.seq = op.seq;
  info.deadline = op_info.deadline;
  transport_->begin(info);
  Fingerprint mine;  // padding bytes travel too, unread: == compares the fields
  mine.seq = op.seq;
  mine.sig = signature_of(op.spec);
  mine.code = transport::wire_code(op.spec.what);
  std::vector<Fingerprint> all(size_);
  std::vector<size_t> counts(size_, sizeof(Fingerprint)), displs(size_);
  for (int r = 0; r < size_; ++r) displs[r] = r * sizeof(Fingerprint);
  // Over tcp even where shared memory is used: a mismatch must not reach the segment.
  algorithms::Context ctx{*transport_, rank_,         size_,     DataType::kUInt8, 1, nullptr,
                          false,       scratch_,      options_.segment_bytes, topology_};
  algorithms::allgatherv_ring(ctx, &mine, all.data(), counts, displs);
  bool same = std::all_of(all.begin(), all.end(), [&](const Fingerprint& f) { return f == mine; });
  if (same) return;
  std::string m = "collective mismatch found by CHORUS_DEBUG=DETAIL on " + where() + ":";
  for (int r = 0; r < size_; ++r) m += " rank " + std::to_string(r) + " called " + describe(all[r]) + ";";
  throw InvalidArgumentError(m + " every rank must call the same collectives in the same order");
}

}  // namespace chorus::communicator
