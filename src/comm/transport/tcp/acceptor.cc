#include "comm/transport/tcp/acceptor.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "chorus/error.h"
#include "comm/common/allowlist.h"
#include "comm/common/logging.h"

namespace chorus::transport::tcp {
namespace {

// Connections accepted per turn of the loop, so that a storm of new ones cannot keep
// the handshakes already under way from being served.
constexpr int kAcceptBatch = 64;
// How long a connection refused for its address has to send its first message.
constexpr std::chrono::seconds kRefusalTimeout{2};
// How long a rank that gives up keeps telling the connections it holds why.
constexpr std::chrono::seconds kGiveUpLinger{1};


}  // namespace

struct Acceptor::Pending {
  Pending(net::Fd accepted, const net::SockAddr& address, ServerHandshake h, const Deadline& d)
      : fd(std::move(accepted)), from(address), handshake(std::move(h)), deadline(d) {}

  net::Fd fd;
  net::SockAddr from;
  ServerHandshake handshake;
  Deadline deadline;
  bool refusing = false;  // refused when accepted (and logged then)
  int claim = -1;         // the rank it authenticated as, while its ACCEPTED is sent
  bool done = false;
};

Acceptor::Acceptor(net::Fd listener, Expected expected,
                   std::shared_ptr<const net::AllowList> allowlist)
    : listener_(std::move(listener)),
      listening_(net::local_address(listener_.get()).str()),
      wakeup_(net::make_wakeup("acceptor")),
      ready_(net::make_wakeup("acceptor")),
      expected_(std::move(expected)),
      allowlist_(std::move(allowlist)),
      claimed_(static_cast<size_t>(expected_.size), false) {
  if (expected_.size > 1) {
    running_ = true;
    thread_ = std::thread([this] { run(); });
  }
}

Acceptor::~Acceptor() { stop(""); }

void Acceptor::take(std::vector<std::pair<int, net::Fd>>& arrived) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t count = 0;
  ssize_t ignored = ::read(ready_.get(), &count, sizeof count);
  (void)ignored;
  for (auto& a : mailbox_) arrived.push_back(std::move(a));
  mailbox_.clear();
  if (error_) std::rethrow_exception(error_);
}

std::string Acceptor::last_refusal() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_refusal_;
}

void Acceptor::refuse_all(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refusing_why_ = why;
  }
  refusing_.store(true, std::memory_order_release);
  net::wake(wakeup_.get());
  std::unique_lock<std::mutex> lock(mutex_);
  seen_.wait_for(lock, std::chrono::seconds(1), [&] { return refusal_seen_ || !running_; });
}

void Acceptor::stop(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_reason_ = why;
  }
  stopping_.store(true, std::memory_order_release);
  net::wake(wakeup_.get());
  if (thread_.joinable()) thread_.join();
}

void Acceptor::run() {
  std::string closing = "rank " + std::to_string(expected_.rank) + " closed its communicator";
  try {
    loop();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    closing = e.what();
  }
  // The connections that have not authenticated are told why they are closed, and the
  // port closes too.
  for (auto& p : pending_) p->handshake.give_up(closing);
  pending_.clear();
  listener_.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }
  seen_.notify_all();
  net::wake(ready_.get());  // a transport waiting for connections learns of the error
}

void Acceptor::loop() {
  bool giving_up = false;
  std::vector<pollfd> fds;
  while (true) {
    if (!giving_up && stopping_.load(std::memory_order_acquire)) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        why = stop_reason_;
      }
      drain(why);
      giving_up = true;
    }
    if (giving_up && pending_.empty()) return;
    if (refusing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!refusal_seen_) {
        refusal_seen_ = true;
        seen_.notify_all();
      }
    }
    // No deadline of its own: it runs until stop(). Each handshake has one.
    std::optional<Deadline> next;
    fds.clear();
    fds.push_back(pollfd{wakeup_.get(), POLLIN, 0});
    fds.push_back(pollfd{giving_up ? -1 : listener_.get(), POLLIN, 0});
    for (const auto& p : pending_) {
      fds.push_back(pollfd{p->fd.get(), p->handshake.events(), 0});
      next = next ? next->earlier(p->deadline) : p->deadline;
    }
    if (::poll(fds.data(), fds.size(), next ? next->remaining_ms(1000) : -1) < 0 &&
        errno != EINTR) {
      net::throw_errno("rank " + std::to_string(expected_.rank) + " accepting connections: poll",
                       errno);
    }
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      ssize_t ignored = ::read(wakeup_.get(), &count, sizeof count);
      (void)ignored;
    }
    // The handshakes under way first, then the deadlines, then new connections: one
    // whose proof is in completes before a newcomer could take its place.
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (fds[i + 2].revents != 0) serve(*pending_[i]);
    }
    for (auto& p : pending_) {
      if (p->done || !p->deadline.expired()) continue;
      p->handshake.time_out();
      serve(*p);
    }
    std::erase_if(pending_, [](const std::unique_ptr<Pending>& p) { return p->done; });
    if (!giving_up && fds[1].revents != 0) accept_new();
  }
}

void Acceptor::accept_new() {
  for (int i = 0; i < kAcceptBatch; ++i) {
    net::SockAddr from;
    net::Fd fd;
    try {
      fd = net::accept_before(listener_.get(), Deadline(std::chrono::milliseconds(0)), &from);
    } catch (const SystemError& e) {
      // Out of descriptors, most likely: make room rather than stop accepting.
      if (!warned_accept_) CHORUS_LOG(kWarn, "rank " << expected_.rank << ": " << e.what());
      warned_accept_ = true;
      if (!pending_.empty()) {
        evict_one();
      } else {
        ::poll(nullptr, 0, 10);
      }
      return;
    }
    if (!fd.valid()) return;
    if (static_cast<int>(pending_.size()) >= kMaxUnauthenticated) evict_one();
    const int accepted = fd.get();
    std::unique_ptr<Pending> p;
    std::string refusing;
    if (refusing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      refusing = refusing_why_;
    }
    if (!refusing.empty()) {
      p = std::make_unique<Pending>(std::move(fd), from,
                                    ServerHandshake::refusal(accepted, expected_, refusing),
                                    Deadline(kRefusalTimeout));
      p->refusing = true;
    } else if (allowlist_->allows(from)) {
      p = std::make_unique<Pending>(std::move(fd), from, ServerHandshake(accepted, expected_),
                                    Deadline(kHandshakeTimeout));
    } else {
      std::string why = "address " + from.ip() + " is not in " + allowlist_->describe();
      refused(from, why);
      p = std::make_unique<Pending>(std::move(fd), from,
                                    ServerHandshake::refusal(accepted, expected_, why),
                                    Deadline(kRefusalTimeout));
      p->refusing = true;
    }
    serve(*p);  // its HELLO is often in already
    if (!p->done) pending_.push_back(std::move(p));
  }
}

void Acceptor::serve(Pending& p) {
  ServerHandshake::Status status = p.handshake.advance();
  if (status == ServerHandshake::Status::kAuthenticated) {
    // Decided here, once the token is proven: an impostor's HELLO claims no rank.
    int rank = p.handshake.hello().from_rank;
    if (refusing_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      p.handshake.refuse(refusing_why_);
      p.refusing = true;
    } else if (claimed_[rank]) {
      p.handshake.refuse("duplicate connection from rank " + std::to_string(rank));
    } else {
      claimed_[rank] = true;
      p.claim = rank;
      p.handshake.accept();
    }
    status = p.handshake.advance();
  }
  if (status == ServerHandshake::Status::kAccepted) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mailbox_.emplace_back(p.claim, std::move(p.fd));
    }
    delivered_.fetch_add(1, std::memory_order_release);
    net::wake(ready_.get());
    p.done = true;
  } else if (status == ServerHandshake::Status::kRefused) {
    if (p.claim >= 0) claimed_[p.claim] = false;  // its ACCEPTED could not be sent
    if (!p.refusing) refused(p.from, p.handshake.refusal());
    p.done = true;
  }
}

void Acceptor::evict_one() {
  // The oldest that has not even sent a HELLO, else the oldest of the rest: a rank's
  // own connection sends its HELLO at once, and needs only a round trip more.
  auto candidate = [](bool need_silent) {
    return [need_silent](const std::unique_ptr<Pending>& p) {
      return !p->done && p->claim < 0 && (!need_silent || !p->handshake.hello_received());
    };
  };
  auto it = std::find_if(pending_.begin(), pending_.end(), candidate(true));
  if (it == pending_.end()) it = std::find_if(pending_.begin(), pending_.end(), candidate(false));
  if (it == pending_.end()) return;
  if (!warned_full_) {
    warned_full_ = true;
    CHORUS_LOG(kWarn, "rank " << expected_.rank << " holds " << kMaxUnauthenticated
                              << " connections that have not authenticated; each new one "
                                 "closes the oldest (a flood of connections to its data port?)");
  }
  std::string why = "closed to make room: " + std::to_string(kMaxUnauthenticated) +
                    " connections were waiting to authenticate";
  (*it)->handshake.give_up(why);
  (*it)->done = true;
  std::string refusal = (*it)->from.str() + ": " + why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_refusal_ = refusal;
  }
  CHORUS_LOG(kDebug, "rank " << expected_.rank << " " << refusal);
  pending_.erase(it);
}

void Acceptor::drain(const std::string& why) {
  std::string refusal = "rank " + std::to_string(expected_.rank) + " gave up connecting";
  if (!why.empty()) refusal += ": " + why;
  if (refusing_.load(std::memory_order_acquire)) {
    // What the transport said when it aborted or closed, which the peers interpret.
    std::lock_guard<std::mutex> lock(mutex_);
    refusal = refusing_why_;
  }
  // Those waiting in the backlog learn why too.
  accept_new();
  Deadline linger(kGiveUpLinger);
  for (auto& p : pending_) {
    p->handshake.refuse_after_read(refusal);
    p->refusing = true;
    p->deadline = p->deadline.earlier(linger);
    serve(*p);
  }
  std::erase_if(pending_, [](const std::unique_ptr<Pending>& p) { return p->done; });
}

void Acceptor::refused(const net::SockAddr& from, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_refusal_ = from.str() + ": " + why;
  }
  CHORUS_LOG(kWarn, "rank " << expected_.rank << " refused connection from " << from.str() << ": "
                            << why);
}

}  // namespace chorus::transport::tcp
