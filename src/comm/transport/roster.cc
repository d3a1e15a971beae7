#include "comm/transport/roster.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "chorus/error.h"
#include "comm/common/wire.h"
#include "comm/store/paged.h"

namespace chorus::transport {
namespace {

constexpr uint32_t kMemberMagic = 0x4d425243;  // "CRBM"
constexpr uint32_t kRosterMagic = 0x52534f52;  // "ROSR"
constexpr size_t kMaxString = 1024;

const char kRosterKey[] = "roster/all";
// The size the first rank to arrive was created with, "SIZE RANK"; and, once a rank
// finds that its own differs, why (every rank waiting looks at it between slices).
const char kSizeKey[] = "roster/size";
const char kSizeMismatchKey[] = "roster/size_mismatch";
// What rank 0 publishes instead of the roster when it gives up.
constexpr char kFailed = '!';

std::string size_mismatch(int rank, int size, int other_rank, int other_size) {
  return "world size differs: rank " + std::to_string(rank) + " was created with size " +
         std::to_string(size) + ", rank " + std::to_string(other_rank) + " with size " +
         std::to_string(other_size);
}

[[noreturn]] void malformed(const std::string& what, const std::string& reason) {
  throw StoreError(what + " is malformed: " + reason);
}

}  // namespace

std::string member_key(int rank) { return "roster/" + std::to_string(rank); }

Bytes encode_member(const Member& m, int size) {
  wire::Writer w;
  w.u32(kMemberMagic);
  w.u32(static_cast<uint32_t>(size));
  w.text(m.ip);
  w.u16(m.port);
  w.text(m.host);
  w.text(m.node);
  return w.take();
}

Member decode_member(std::span<const uint8_t> bytes, int rank, int* size) {
  wire::Reader r(bytes);
  uint32_t magic = 0, n = 0;
  Member m;
  std::string reason;
  bool ok = r.u32("magic", &magic) && (magic == kMemberMagic || r.fail("bad magic number")) &&
            r.u32("size", &n) && r.text("address", kMaxString, &m.ip) &&
            r.u16("port", &m.port) && r.text("host", kMaxString, &m.host) &&
            r.text("node", kMaxString, &m.node) && r.finish(&reason);
  if (!ok && reason.empty()) r.finish(&reason);  // the reason of the read that failed
  if (ok && (m.ip.empty() || m.port == 0 || n < 1 || n > static_cast<uint32_t>(INT32_MAX))) {
    ok = false;
    reason = "empty address, port 0 or a size out of range";
  }
  if (!ok) malformed("the record rank " + std::to_string(rank) + " published", reason);
  *size = static_cast<int>(n);
  return m;
}

// The distinct strings, each once; then runs of consecutive ranks with the same
// address, host and node (their indices in the strings); then every rank's port.
Bytes encode_roster(const std::vector<Member>& members) {
  std::vector<std::string> strings;
  std::map<std::string, uint32_t> index;
  auto id = [&](const std::string& s) {
    auto [it, added] = index.emplace(s, static_cast<uint32_t>(strings.size()));
    if (added) strings.push_back(s);
    return it->second;
  };
  struct Run {
    uint32_t length, ip, host, node;
  };
  std::vector<Run> runs;
  for (const Member& m : members) {
    Run next{1, id(m.ip), id(m.host), id(m.node)};
    if (!runs.empty() && runs.back().ip == next.ip && runs.back().host == next.host &&
        runs.back().node == next.node) {
      ++runs.back().length;
    } else {
      runs.push_back(next);
    }
  }
  wire::Writer w;
  w.u32(kRosterMagic);
  w.u32(static_cast<uint32_t>(members.size()));
  w.u32(static_cast<uint32_t>(strings.size()));
  for (const std::string& s : strings) w.text(s);
  w.u32(static_cast<uint32_t>(runs.size()));
  for (const Run& run : runs) {
    w.u32(run.length);
    w.u32(run.ip);
    w.u32(run.host);
    w.u32(run.node);
  }
  for (const Member& m : members) w.u16(m.port);
  return w.take();
}

std::vector<Member> decode_roster(std::span<const uint8_t> bytes, int size) {
  const std::string what = "the roster rank 0 published";
  wire::Reader r(bytes);
  uint32_t magic = 0, n = 0, string_count = 0, run_count = 0;
  if (!r.u32("magic", &magic) || magic != kRosterMagic) malformed(what, "bad magic number");
  if (!r.u32("size", &n) || n != static_cast<uint32_t>(size)) {
    malformed(what, "it lists " + std::to_string(n) + " ranks, not " + std::to_string(size));
  }
  std::string reason;
  // A string takes at least its 4-byte length, a run 16 bytes.
  if (!r.count("strings", UINT32_MAX, 4, &string_count)) {
    r.finish(&reason);
    malformed(what, reason);
  }
  std::vector<std::string> strings(string_count);
  for (std::string& s : strings) {
    if (!r.text("string", kMaxString, &s)) {
      r.finish(&reason);
      malformed(what, reason);
    }
  }
  if (!r.count("runs", static_cast<size_t>(size), 16, &run_count)) {
    r.finish(&reason);
    malformed(what, reason);
  }
  std::vector<Member> members;
  members.reserve(static_cast<size_t>(size));
  for (uint32_t k = 0; k < run_count; ++k) {
    uint32_t length = 0, ip = 0, host = 0, node = 0;
    if (!(r.u32("run length", &length) && r.u32("address", &ip) && r.u32("host", &host) &&
          r.u32("node", &node))) {
      r.finish(&reason);
      malformed(what, reason);
    }
    if (ip >= string_count || host >= string_count || node >= string_count) {
      malformed(what, "a run names string " + std::to_string(std::max({ip, host, node})) +
                          " of " + std::to_string(string_count));
    }
    if (length == 0 || length > static_cast<uint32_t>(size) - members.size()) {
      malformed(what, "its runs do not add up to " + std::to_string(size) + " ranks");
    }
    for (uint32_t i = 0; i < length; ++i) members.push_back({strings[ip], 0, strings[host], strings[node]});
  }
  if (members.size() != static_cast<size_t>(size)) {
    malformed(what, "its runs add up to " + std::to_string(members.size()) + " ranks, not " +
                        std::to_string(size));
  }
  for (int rank = 0; rank < size; ++rank) {
    Member& m = members[static_cast<size_t>(rank)];
    if (!r.u16("port", &m.port)) break;
    if (m.port == 0 || m.ip.empty()) {
      malformed(what, "rank " + std::to_string(rank) + " has an empty address or port 0");
    }
  }
  if (!r.finish(&reason)) malformed(what, reason);
  return members;
}

std::vector<Member> exchange_roster(Store& store, int rank, int size, const Member& mine,
                                    const Deadline& deadline, const std::string& comm_id) {
  const std::string where = "connecting communicator '" + comm_id + "' (rank " +
                            std::to_string(rank) + " of " + std::to_string(size) + ")";
  auto fail = [&](const std::string& mismatch) {
    store.set(kSizeMismatchKey, mismatch);
    throw ConfigError(where + ": " + mismatch);
  };
  auto look_for_mismatch = [&] {
    if (store.check({kSizeMismatchKey})) {
      throw ConfigError(where + ": " + store.get_string(kSizeMismatchKey));
    }
  };
  store.set(member_key(rank), encode_member(mine, size));
  std::string first_text = std::to_string(size) + " " + std::to_string(rank);
  Bytes first_bytes =
      store.compare_set(kSizeKey, Bytes(), Bytes(first_text.begin(), first_text.end()));
  std::istringstream first(std::string(first_bytes.begin(), first_bytes.end()));
  int first_size = 0, first_rank = 0;
  first >> first_size >> first_rank;
  if (first_size != size) fail(size_mismatch(rank, size, first_rank, first_size));

  if (rank != 0) {
    std::vector<Bytes> value;
    try {
      value = store::pages::wait_and_get(store, {kRosterKey}, deadline, look_for_mismatch);
    } catch (const TimeoutError& e) {
      throw TimeoutError(where + ": rank 0, which gathers every rank's address, published no "
                                 "roster within the connect timeout (is rank 0 running, and "
                                 "does it reach the store?): " + e.what());
    }
    const Bytes& roster = value[0];
    if (!roster.empty() && roster[0] == static_cast<uint8_t>(kFailed)) {
      look_for_mismatch();  // a world size that differs is a ConfigError on every rank
      throw TimeoutError(where + ": rank 0 gave up gathering the ranks' addresses: " +
                         std::string(roster.begin() + 1, roster.end()));
    }
    std::vector<Member> members = decode_roster(roster, size);
    if (members[static_cast<size_t>(rank)] != mine) {
      throw StoreError(where + ": the roster rank 0 published does not hold this rank's own "
                               "record (two ranks started as rank " + std::to_string(rank) + "?)");
    }
    return members;
  }

  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) keys.push_back(member_key(r));
  std::vector<Bytes> values;
  try {
    values = store::pages::wait_and_get(store, keys, deadline, look_for_mismatch);
  } catch (const TimeoutError& e) {
    std::string why = "not every rank published its address within the connect timeout: " +
                      std::string(e.what());
    store.set(kRosterKey, std::string(1, kFailed) + why);
    throw TimeoutError(where + ": " + why);
  }
  std::vector<Member> members;
  members.reserve(static_cast<size_t>(size));
  try {
    for (int r = 0; r < size; ++r) {
      int their_size = 0;
      members.push_back(decode_member(values[static_cast<size_t>(r)], r, &their_size));
      if (their_size != size) fail(size_mismatch(r, their_size, rank, size));
    }
  } catch (const Error& e) {
    // The others wait for the roster: they fail with these words rather than time out.
    store.set(kRosterKey, std::string(1, kFailed) + e.what());
    throw;
  }
  store.set(kRosterKey, encode_roster(members));
  return members;
}

}  // namespace chorus::transport
