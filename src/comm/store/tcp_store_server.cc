// TcpStoreServer: one thread, one epoll set, non-blocking sockets.
//
// Error policy inside the loop: nothing a client sends can throw out of the loop. A
// malformed frame, an oversized length or a failed socket call drops that client
// (logged with its address and the reason); a request that breaks a store rule
// (add to a non-integer) gets an INVALID_ARGUMENT reply. Blocking requests (GET of a
// missing key, WAIT) are parked as waiters and answered from the loop when their keys
// appear or their deadline passes, so every request gets exactly one reply in order.
//
// Authentication: every new connection runs the job token's handshake
// (comm/common/handshake.h, framed as in tcp_store_protocol.h) before any of its frames
// is taken as a request: its HELLO is answered with a CHALLENGE, a right PROOF with
// ACCEPTED, message by message as they arrive (each connection's handshake::Server);
// its frames are bounded by the smaller authentication limit meanwhile. A connection
// from an address the allow-list does not name is answered REFUSED at its HELLO. A
// wrong or malformed message, or a handshake not done by the authentication deadline,
// is refused and closes the connection with a warning naming its address.
//
// Backpressure: a client's next frame is handled only once its previous reply is
// fully sent and it has no parked request, and its socket is not read meanwhile, so
// each client holds at most one frame in and one reply out.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "chorus/error.h"
#include "chorus/store.h"
#include "comm/common/allowlist.h"
#include "comm/common/handshake.h"
#include "comm/common/logging.h"
#include "comm/common/settings.h"
#include "comm/common/socket.h"
#include "comm/store/server_frames.h"
#include "comm/store/server_state.h"
#include "comm/store/tcp_store_protocol.h"

namespace chorus {
namespace {

using store::server::Clock;
using store::server::ms_until;
using store::wire::Reply;
using store::wire::Request;

// epoll user data for the two non-client descriptors; clients count up from here.
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstClientId = 2;
constexpr size_t kReadChunk = 256 << 10;

struct Client {
  uint64_t id = 0;
  net::Fd fd;
  std::string address;
  Bytes in;   // received bytes not yet handled
  Bytes out;  // encoded reply not yet fully sent
  size_t out_sent = 0;
  uint64_t waiter = 0;    // the parked request's waiter id, 0 when none
  uint32_t interest = 0;  // the epoll event mask currently registered
  bool authenticated = false;
  handshake::Server flow{std::string()};  // the handshake, until authenticated
  Clock::time_point auth_deadline;  // while not authenticated

  bool sending() const { return out_sent < out.size(); }
  bool busy() const { return sending() || waiter != 0; }
};

}  // namespace

struct TcpStoreServer::Impl {
  Impl(const std::string& host, uint16_t requested_port, const TcpStoreServerOptions& options);
  ~Impl();
  void run();
  void stop();

  std::string host;
  uint16_t port = 0;
  std::string token;
  net::AllowList allowlist;
  std::chrono::milliseconds auth_timeout;
  std::atomic<int> num_clients{0};
  std::atomic<bool> stopping{false};
  net::Fd listen_fd;
  net::Fd wake_fd;  // eventfd: the destructor's way to interrupt epoll_wait
  net::Fd epoll_fd;
  std::thread thread;

 private:
  // Everything below is touched by the server thread only.
  enum class FrameResult { kReady, kIncomplete, kDropped };
  bool loop_once();
  void on_event(uint64_t id, uint32_t events);
  void accept_clients();
  void on_client_event(Client& client, uint32_t events);
  bool read_input(Client& client);
  void serve(uint64_t client_id);
  bool flush(Client& client);
  FrameResult next_frame(Client& client, Request* request);
  FrameResult authenticate(Client& client);
  void refuse(Client& client, const std::string& reason);
  void log_refusal(const std::string& address, const std::string& reason);
  void expire_authentications();
  int next_timeout_ms(Clock::time_point now) const;
  void handle(Client& client, Request& request);
  void deliver_answers();
  void expire_waiters();
  void serve_touched();
  void send_reply(Client& client, const Reply& reply);
  void update_interest(Client& client);
  void drop(Client& client, const std::string& reason, bool warn);
  void drop_all(const std::string& reason);

  store::server::ServerState state_;
  std::unordered_map<uint64_t, std::unique_ptr<Client>> clients_;
  // Clients given a reply by another client's request, served after the current event.
  std::vector<uint64_t> touched_;
  // Connections still to authenticate, by deadline.
  std::set<std::pair<Clock::time_point, uint64_t>> auth_deadlines_;
  uint64_t next_client_id_ = kFirstClientId;
  Bytes scratch_ = Bytes(kReadChunk);
};

TcpStoreServer::Impl::Impl(const std::string& host_in, uint16_t requested_port,
                           const TcpStoreServerOptions& options)
    : host(host_in),
      token(options.job_token ? *options.job_token : settings::job_token()),
      auth_timeout(std::max(options.auth_timeout, std::chrono::milliseconds(1))),
      state_(options.connection_scoped_prefix) {
  // Before the port is bound: a bad allow-list fails the start, not each connection.
  if (!options.allowlist_file) {
    allowlist = net::AllowList::from_env();
  } else if (!options.allowlist_file->empty()) {
    allowlist = net::AllowList::load(*options.allowlist_file, "TcpStoreServerOptions");
  }
  listen_fd = net::listen_on(host, requested_port);
  port = net::local_address(listen_fd.get()).port();
  wake_fd = net::make_wakeup("store server");
  epoll_fd = net::Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) net::throw_errno("store server: epoll_create1", errno);
  for (auto [fd, id] : {std::pair{listen_fd.get(), kListenId}, {wake_fd.get(), kWakeId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      net::throw_errno("store server: epoll_ctl", errno);
    }
  }
}

TcpStoreServer::Impl::~Impl() = default;

void TcpStoreServer::Impl::run() {
  while (!stopping.load(std::memory_order_acquire)) {
    try {
      if (!loop_once()) return;
    } catch (const std::exception& e) {
      // Only resource exhaustion gets here (client input never throws); keep serving.
      CHORUS_LOG(kError, "store server on " << host << ":" << port << ": " << e.what());
    }
  }
}

// One epoll_wait and everything it reports. False when the loop cannot go on.
bool TcpStoreServer::Impl::loop_once() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  int timeout_ms = next_timeout_ms(Clock::now());
  int n = ::epoll_wait(epoll_fd.get(), events, kMaxEvents, timeout_ms);
  if (n < 0 && errno != EINTR) {
    // Closing every connection turns the clients' pending calls into clear errors.
    drop_all(std::string("epoll_wait failed: ") + std::strerror(errno));
    return false;
  }
  for (int i = 0; i < n; ++i) on_event(events[i].data.u64, events[i].events);
  expire_waiters();
  expire_authentications();
  return true;
}

int TcpStoreServer::Impl::next_timeout_ms(Clock::time_point now) const {
  int waiters = state_.next_timeout_ms(now);
  if (auth_deadlines_.empty()) return waiters;
  int auth = ms_until(auth_deadlines_.begin()->first, now);
  return waiters < 0 ? auth : std::min(waiters, auth);
}

void TcpStoreServer::Impl::expire_authentications() {
  Clock::time_point now = Clock::now();
  std::vector<uint64_t> late;
  for (auto it = auth_deadlines_.begin(); it != auth_deadlines_.end() && it->first <= now; ++it) {
    late.push_back(it->second);
  }
  for (uint64_t id : late) {
    auto it = clients_.find(id);
    if (it == clients_.end()) continue;
    Client& client = *it->second;
    if (client.flow.refusing_why()) {
      refuse(client, *client.flow.refusing_why());
      continue;
    }
    std::string why =
        "did not prove the job token within " + std::to_string(auth_timeout.count()) + " ms";
    if (client.in.empty() && client.flow.stage() == handshake::Server::Stage::kHello) {
      why += " (it sent no HELLO: a chorus client older than authentication version " +
             std::to_string(store::wire::kAuthVersion) + " waits for the server to speak first)";
    }
    refuse(client, why);
  }
}

void TcpStoreServer::Impl::on_event(uint64_t id, uint32_t events) {
  if (id == kWakeId) return;  // stopping is re-checked by run()
  if (id == kListenId) {
    accept_clients();
    return;
  }
  auto it = clients_.find(id);
  if (it == clients_.end()) return;  // dropped earlier in this batch
  on_client_event(*it->second, events);
  serve_touched();
}

void TcpStoreServer::Impl::accept_clients() {
  // Bounded so that a connection storm cannot starve the clients already connected.
  for (int i = 0; i < 64; ++i) {
    net::SockAddr peer;
    net::Fd fd;
    try {
      fd = net::accept_before(listen_fd.get(), Deadline(std::chrono::milliseconds(0)), &peer);
    } catch (const Error& e) {
      CHORUS_LOG(kWarn, "store server on " << host << ":" << port << ": " << e.what());
      return;
    }
    if (!fd.valid()) return;
    auto client = std::make_unique<Client>();
    client->flow = handshake::Server(token);
    if (!allowlist.allows(peer)) {
      // Refused at its HELLO: closing once that is read does not reset the connection
      // before the client reads why.
      client->flow =
          handshake::Server::refusing("address " + peer.ip() + " is not in " + allowlist.describe());
    }
    client->id = next_client_id_++;
    client->fd = std::move(fd);
    client->address = peer.str();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = client->id;
    if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, client->fd.get(), &ev) != 0) {
      CHORUS_LOG(kWarn, "store server: cannot watch client " << client->address << ": "
                                                             << std::strerror(errno));
      continue;
    }
    client->interest = ev.events;
    CHORUS_LOG(kDebug, "store server: client " << client->address << " connected");
    client->auth_deadline = Clock::now() + auth_timeout;
    auth_deadlines_.emplace(client->auth_deadline, client->id);
    uint64_t id = client->id;
    clients_.emplace(id, std::move(client));
    num_clients.fetch_add(1, std::memory_order_relaxed);
    serve(id);  // the client speaks first: takes its HELLO if it is in already
  }
}

void TcpStoreServer::Impl::on_client_event(Client& client, uint32_t events) {
  if ((events & EPOLLERR) != 0) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(client.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    drop(client, std::string("socket error: ") + std::strerror(err), false);
    return;
  }
  // A busy client is not read (see the backpressure note at the top); a hang-up then
  // means it gave up on its request, which is no error of ours.
  if (client.busy() && (events & (EPOLLHUP | EPOLLRDHUP)) != 0) {
    drop(client, "disconnected while its request was pending", false);
    return;
  }
  if (!client.busy() && (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) != 0) {
    if (!read_input(client)) return;
  }
  serve(client.id);
}

// Reads what is available, at most one chunk. False when the client was dropped.
bool TcpStoreServer::Impl::read_input(Client& client) {
  ssize_t n = ::recv(client.fd.get(), scratch_.data(), scratch_.size(), 0);
  if (n > 0) {
    client.in.insert(client.in.end(), scratch_.begin(), scratch_.begin() + n);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n < 0) {
    drop(client, std::string("receive failed: ") + std::strerror(errno), false);
    return false;
  }
  if (client.in.empty()) {
    drop(client, "disconnected", false);
  } else {
    drop(client,
         "closed the connection in the middle of a frame (" + std::to_string(client.in.size()) +
             " bytes of it received)",
         true);
  }
  return false;
}

// Sends pending output and handles buffered frames until the client is busy or has
// no complete frame left. May drop the client.
void TcpStoreServer::Impl::serve(uint64_t client_id) {
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  Client& client = *it->second;
  while (true) {
    if (!flush(client)) return;
    if (client.busy()) break;
    if (!client.authenticated) {
      FrameResult result = authenticate(client);
      if (result == FrameResult::kDropped) return;
      if (result == FrameResult::kIncomplete) break;
      continue;  // sends the answer, then takes what followed
    }
    Request request;
    FrameResult result = next_frame(client, &request);
    if (result == FrameResult::kDropped) return;
    if (result == FrameResult::kIncomplete) break;
    handle(client, request);
  }
  update_interest(client);
}

bool TcpStoreServer::Impl::flush(Client& client) {
  while (client.sending()) {
    ssize_t n = ::send(client.fd.get(), client.out.data() + client.out_sent,
                       client.out.size() - client.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      client.out_sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else {
      drop(client, std::string("send failed: ") + std::strerror(errno), false);
      return false;
    }
  }
  // Give back the memory of a large reply rather than keep it per idle client.
  if (client.out.capacity() > kReadChunk) Bytes().swap(client.out);
  client.out.clear();
  client.out_sent = 0;
  return true;
}

// Takes the next complete frame out of the client's input. Lengths are checked as
// soon as the prefix is in, so an oversized frame is refused before it is buffered.
TcpStoreServer::Impl::FrameResult TcpStoreServer::Impl::next_frame(Client& client,
                                                                   Request* request) {
  std::string reason;
  switch (store::server::take_request(client.in, request, &reason)) {
    case store::server::Take::kIncomplete:
      return FrameResult::kIncomplete;
    case store::server::Take::kRefused:
      drop(client, reason, true);
      return FrameResult::kDropped;
    case store::server::Take::kReady:
      break;
  }
  if (client.in.empty() && client.in.capacity() > kReadChunk) Bytes().swap(client.in);
  return FrameResult::kReady;
}

// Takes the client's next authentication message out of its input and answers it
// (its handshake::Server says what with; the store's hook checks the HELLO's auth
// version). kReady when an answer is queued (ACCEPTED: the client is now
// authenticated); kDropped when it was refused.
TcpStoreServer::Impl::FrameResult TcpStoreServer::Impl::authenticate(Client& client) {
  std::string reason;
  handshake::Message message;
  switch (store::server::take_auth(client.in, &message, &reason)) {
    case store::server::Take::kIncomplete:
      return FrameResult::kIncomplete;
    case store::server::Take::kRefused:
      refuse(client, reason);
      return FrameResult::kDropped;
    case store::server::Take::kReady:
      break;
  }
  std::optional<handshake::Message> answer =
      client.flow.take(message, store::wire::check_hello_fields);
  if (client.flow.stage() == handshake::Server::Stage::kProved) {
    answer = client.flow.accept();
  }
  if (client.flow.stage() == handshake::Server::Stage::kDone &&
      !client.flow.accepted()) {
    refuse(client, client.flow.refusal());
    return FrameResult::kDropped;
  }
  Bytes frame = store::wire::encode_auth(*answer);
  client.out.insert(client.out.end(), frame.begin(), frame.end());
  if (client.flow.accepted()) {
    client.authenticated = true;
    client.flow = handshake::Server(std::string());  // the token's copy goes
    auth_deadlines_.erase({client.auth_deadline, client.id});
    CHORUS_LOG(kDebug, "store server: client " << client.address << " authenticated");
  }
  return FrameResult::kReady;
}

// Closes a connection that did not authenticate, saying why to the client when its
// socket takes it, and logs it with its address.
void TcpStoreServer::Impl::refuse(Client& client, const std::string& reason) {
  log_refusal(client.address, reason);
  if (!client.sending()) store::server::send_refusal(client.fd.get(), reason);  // else it would interleave
  drop(client, "refused: " + reason, false);
}

void TcpStoreServer::Impl::log_refusal(const std::string& address, const std::string& reason) {
  CHORUS_LOG(kWarn, "store server on " << host << ":" << port << ": refused connection from "
                                       << address << ": " << reason);
}

void TcpStoreServer::Impl::handle(Client& client, Request& request) {
  if (std::optional<Reply> reply = state_.apply(client.id, request, &client.waiter)) {
    send_reply(client, *reply);
  }
  deliver_answers();
}

// Queues the answers of parked requests that finished; their clients are served after
// the current event.
void TcpStoreServer::Impl::deliver_answers() {
  for (store::server::Answer& answer : state_.take_answers()) {
    auto it = clients_.find(answer.client);
    if (it == clients_.end()) continue;
    Client& client = *it->second;
    client.waiter = 0;
    send_reply(client, answer.reply);
    touched_.push_back(client.id);
  }
}

void TcpStoreServer::Impl::expire_waiters() {
  state_.expire(Clock::now());
  deliver_answers();
  serve_touched();
}

void TcpStoreServer::Impl::serve_touched() {
  while (!touched_.empty()) {
    std::vector<uint64_t> batch;
    batch.swap(touched_);
    for (uint64_t client_id : batch) serve(client_id);
  }
}

// Queues a reply; serve() sends it.
void TcpStoreServer::Impl::send_reply(Client& client, const Reply& reply) {
  Bytes frame = store::wire::encode_reply(reply);
  if (client.out.empty()) {
    client.out = std::move(frame);
  } else {
    client.out.insert(client.out.end(), frame.begin(), frame.end());
  }
}

void TcpStoreServer::Impl::update_interest(Client& client) {
  uint32_t wanted = EPOLLRDHUP;
  if (client.sending()) wanted |= EPOLLOUT;
  if (!client.busy()) wanted |= EPOLLIN;
  if (wanted == client.interest) return;
  epoll_event ev{};
  ev.events = wanted;
  ev.data.u64 = client.id;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, client.fd.get(), &ev) != 0) {
    return drop(client, std::string("epoll_ctl failed: ") + std::strerror(errno), true);
  }
  client.interest = wanted;
}

// Forgets the client and closes its socket; `client` is gone afterwards.
void TcpStoreServer::Impl::drop(Client& client, const std::string& reason, bool warn) {
  if (warn) {
    CHORUS_LOG(kWarn, "store server on " << host << ":" << port << ": dropping client "
                                         << client.address << ": " << reason);
  } else {
    CHORUS_LOG(kDebug, "store server on " << host << ":" << port << ": client " << client.address
                                          << " " << reason);
  }
  if (client.waiter != 0) state_.cancel(client.waiter);
  state_.client_closed(client.id);
  if (!client.authenticated) auth_deadlines_.erase({client.auth_deadline, client.id});
  ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_DEL, client.fd.get(), nullptr);
  uint64_t id = client.id;  // a copy: erasing destroys `client`
  clients_.erase(id);
  num_clients.fetch_sub(1, std::memory_order_relaxed);
}

void TcpStoreServer::Impl::drop_all(const std::string& reason) {
  CHORUS_LOG(kError, "store server on " << host << ":" << port << " stops serving: " << reason);
  std::vector<uint64_t> ids;
  for (const auto& entry : clients_) ids.push_back(entry.first);
  for (uint64_t id : ids) drop(*clients_.at(id), reason, false);
}

void TcpStoreServer::Impl::stop() {
  stopping.store(true, std::memory_order_release);
  net::wake(wake_fd.get());
  if (thread.joinable()) thread.join();
}

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port,
                               const TcpStoreServerOptions& options)
    : impl_(std::make_unique<Impl>(host, port, options)) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  // Clients' sockets close with impl_, after the thread has stopped touching them.
  impl_->stop();
}

uint16_t TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::host() const { return impl_->host; }
int TcpStoreServer::num_clients() const {
  return impl_->num_clients.load(std::memory_order_relaxed);
}

}  // namespace chorus
