// TcpStore: one connection, one request in flight, every call bounded by a deadline.
//
// A call whose deadline passes before its reply arrives closes the connection: a late
// reply must never be taken for the answer to the next request. The next call then
// reconnects.
#include <mutex>

#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/store/tcp_store_protocol.h"

namespace chorus {
namespace {

using store::wire::Op;
using store::wire::Reply;
using store::wire::ReplyKind;
using store::wire::Request;

// How long past its own timeout a waiting call waits for the server's TIMEOUT reply.
constexpr std::chrono::milliseconds kReplyGrace = std::chrono::seconds(3);

// "get of key 'k'", "wait of keys 'a', 'b'", "num_keys": what a call was doing.
std::string describe(const Request& request) {
  std::string what = store::wire::op_name(request.op);
  if (request.op == Op::kCheck || request.op == Op::kWait) {
    return what + (request.keys.size() == 1 ? " of key " : " of keys ") +
           store::rules::quote_keys(request.keys, request.keys.size());
  }
  if (request.op == Op::kNumKeys) return what;
  return what + " of key " + store::rules::quote_keys({request.key}, 1);
}

// The deadline of a call that does not wait on keys.
Deadline deadline_after(std::chrono::milliseconds timeout) {
  return Deadline(store::rules::bounded_timeout(timeout));
}

// The deadline of a call that waits on keys for `timeout`: the server answers at
// `timeout`, the grace covers the reply's trip.
Deadline waiting_deadline(std::chrono::milliseconds timeout) {
  return Deadline(store::rules::bounded_timeout(timeout) + kReplyGrace);
}

uint64_t timeout_field(std::chrono::milliseconds timeout) {
  return static_cast<uint64_t>(store::rules::bounded_timeout(timeout).count());
}

Request keyed(Op op, const std::string& key) {
  store::rules::check_key(key);
  Request request;
  request.op = op;
  request.key = key;
  return request;
}

Request multi_keyed(Op op, const std::vector<std::string>& keys) {
  store::rules::check_keys(keys);
  Request request;
  request.op = op;
  request.keys = keys;
  return request;
}

}  // namespace

struct TcpStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds connect_timeout;
  std::string token;  // the job token, proven on every connection
  std::mutex mutex;  // serializes calls; guards fd
  net::Fd fd;        // invalid after a failed call, until the next call reconnects

  std::string where() const { return "store at " + host + ":" + std::to_string(port); }
  void connect(const Deadline& deadline);
  Reply call(const Request& request, ReplyKind expected, const Deadline& deadline);
  Reply exchange(const Bytes& frame, const Request& request, const Deadline& deadline);
  Reply read_reply(const Request& request, const Deadline& deadline);
  void check_reply(const Reply& reply, ReplyKind expected, const Request& request);

  // Closes the connection, so that a late or garbled reply cannot be read as the
  // answer to a later request, and throws.
  template <typename ErrorType>
  [[noreturn]] void fail(const std::string& message) {
    fd.reset();
    throw ErrorType(message);
  }
};

// Connects and authenticates. A refusal is not retried: another token or a missing
// allow-list entry does not fix itself.
void TcpStore::Impl::connect(const Deadline& deadline) {
  net::Fd connected = net::connect_to(host, port, deadline, "store client");
  try {
    store::wire::authenticate_client(connected.get(), token, deadline, where());
  } catch (const TimeoutError& e) {
    throw TimeoutError(where() + " did not complete the authentication before the deadline (" +
                       e.what() + ")");
  }
  fd = std::move(connected);
}

// Sends `request` and returns its reply, which has kind `expected`. Throws
// TimeoutError (the server's or the client's deadline passed), StoreError (connection
// lost, malformed reply) or InvalidArgumentError (a request too large to send, or one
// the server refused).
Reply TcpStore::Impl::call(const Request& request, ReplyKind expected, const Deadline& deadline) {
  Bytes frame = store::wire::encode_request(request);
  if (store::wire::payload_size(frame) > store::wire::kMaxFrameBytes) {
    throw InvalidArgumentError("store " + describe(request) + ": the request is " +
                               std::to_string(store::wire::payload_size(frame)) +
                               " bytes, more than the frame limit of " +
                               std::to_string(store::wire::kMaxFrameBytes));
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (!fd.valid()) connect(Deadline(connect_timeout).earlier(deadline));
  Reply reply = exchange(frame, request, deadline);
  check_reply(reply, expected, request);
  return reply;
}

void TcpStore::Impl::check_reply(const Reply& reply, ReplyKind expected, const Request& request) {
  bool waits = request.op == Op::kGet || request.op == Op::kWait;
  if (reply.kind == expected) return;
  if (reply.kind == ReplyKind::kTimeout && waits) {
    // The connection stays in sync: the server answered this very request.
    // Only the missing keys are listed, as the in-memory store does.
    std::string what = request.op == Op::kGet
                           ? describe(request)
                           : "wait for " + std::to_string(request.keys.size()) + " keys";
    throw TimeoutError(store::rules::timeout_message(where() + ": " + what,
                                                   std::chrono::milliseconds(request.timeout_ms),
                                                   reply.keys, reply.missing_count));
  }
  if (reply.kind == ReplyKind::kInvalidArgument) {
    throw InvalidArgumentError(reply.message + " (" + where() + ")");
  }
  fail<StoreError>(where() + " answered the " + describe(request) + " with reply kind " +
                   std::to_string(static_cast<int>(reply.kind)) + ", expected " +
                   std::to_string(static_cast<int>(expected)));
}

Reply TcpStore::Impl::exchange(const Bytes& frame, const Request& request,
                               const Deadline& deadline) {
  std::string what = where() + ": " + describe(request);
  try {
    net::write_full(fd.get(), frame.data(), frame.size(), deadline, what);
    return read_reply(request, deadline);
  } catch (const TimeoutError&) {
    fail<TimeoutError>(where() + " did not answer the " + describe(request) +
                       " before the deadline; closed the connection (the next call "
                       "reconnects)");
  } catch (const PeerError& e) {
    fail<StoreError>(where() + " closed the connection during " + describe(request) + " (" +
                     e.what() + ")");
  }
}

Reply TcpStore::Impl::read_reply(const Request& request, const Deadline& deadline) {
  std::string what = where() + ": reply to " + describe(request);
  uint8_t prefix[store::wire::kLengthPrefixBytes];
  net::read_full(fd.get(), prefix, sizeof prefix, deadline, what);
  uint32_t length = store::wire::read_length_prefix(prefix);
  std::string reason;
  if (!store::wire::check_frame_length(length, &reason)) {
    fail<StoreError>(what + " is malformed: " + reason);
  }
  Bytes payload(length);  // length was checked above
  net::read_full(fd.get(), payload.data(), payload.size(), deadline, what);
  Reply reply;
  if (!store::wire::decode_reply(payload, &reply, &reason)) fail<StoreError>(what + ": " + reason);
  return reply;
}

TcpStore::TcpStore(const std::string& host, uint16_t port,
                   std::chrono::milliseconds connect_timeout,
                   std::optional<std::string> job_token)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->connect_timeout = connect_timeout;
  impl_->token = job_token ? *job_token : settings::job_token();
  impl_->connect(Deadline(connect_timeout));
}

TcpStore::~TcpStore() = default;

const std::string& TcpStore::host() const { return impl_->host; }
uint16_t TcpStore::port() const { return impl_->port; }

void TcpStore::set(const std::string& key, const Bytes& value) {
  Request request = keyed(Op::kSet, key);
  store::rules::check_value(key, value);
  request.value = value;
  impl_->call(request, ReplyKind::kOk, deadline_after(timeout()));
}

Bytes TcpStore::get(const std::string& key) {
  Request request = keyed(Op::kGet, key);
  request.timeout_ms = timeout_field(timeout());
  return impl_->call(request, ReplyKind::kValue, waiting_deadline(timeout())).value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Request request = keyed(Op::kAdd, key);
  request.delta = delta;
  return impl_->call(request, ReplyKind::kInteger, deadline_after(timeout())).integer;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Request request = keyed(Op::kCompareSet, key);
  store::rules::check_value(key, expected);
  store::rules::check_value(key, desired);
  request.expected = expected;
  request.value = desired;
  return impl_->call(request, ReplyKind::kValue, deadline_after(timeout())).value;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Request request = multi_keyed(Op::kCheck, keys);
  return impl_->call(request, ReplyKind::kBool, deadline_after(timeout())).flag;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Request request = multi_keyed(Op::kWait, keys);
  request.timeout_ms = timeout_field(timeout);
  impl_->call(request, ReplyKind::kOk, waiting_deadline(timeout));
}

bool TcpStore::delete_key(const std::string& key) {
  Request request = keyed(Op::kDelete, key);
  return impl_->call(request, ReplyKind::kBool, deadline_after(timeout())).flag;
}

int64_t TcpStore::num_keys() {
  Request request;
  request.op = Op::kNumKeys;
  return impl_->call(request, ReplyKind::kInteger, deadline_after(timeout())).integer;
}

}  // namespace chorus
