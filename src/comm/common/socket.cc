#include "comm/common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "chorus/error.h"

namespace chorus::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void throw_errno(const std::string& what, int err) {
  throw SystemError(what + ": " + std::strerror(err));
}

Fd make_wakeup(const char* what) {
  Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) throw_errno(std::string(what) + ": eventfd", errno);
  return fd;
}

void wake(int wakeup_fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(wakeup_fd, &one, sizeof one);
  (void)ignored;
}

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string SockAddr::ip() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf,
              sizeof buf);
  }
  return buf;
}

std::string SockAddr::str() const {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, wrongly) on "[" + ip() + ...
  std::string s = family() == AF_INET6 ? "[" : "";
  s += ip();
  s += family() == AF_INET6 ? "]:" : ":";
  s += std::to_string(port());
  return s;
}

std::vector<SockAddr> resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    throw SystemError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  std::vector<SockAddr> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    SockAddr a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    out.push_back(a);
  }
  freeaddrinfo(res);
  // IPv4 first: loopback tests and most clusters use it.
  std::stable_partition(out.begin(), out.end(),
                        [](const SockAddr& a) { return a.family() == AF_INET; });
  return out;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw_errno("fcntl", errno);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Fd listen_on(const std::string& host, uint16_t port, int backlog) {
  std::vector<SockAddr> addrs = resolve(host, port);
  int last_err = 0;
  for (const SockAddr& a : addrs) {
    Fd fd(::socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last_err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a.get(), a.len) != 0) {
      int err = errno;
      if (err == EADDRINUSE) {
        throw SystemError("cannot listen on " + host + ":" + std::to_string(port) +
                          ": address already in use (another job or store on this port? "
                          "choose another MASTER_PORT)");
      }
      last_err = err;
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last_err = errno;
      continue;
    }
    set_nonblocking(fd.get());
    return fd;
  }
  throw_errno("cannot listen on " + host + ":" + std::to_string(port), last_err);
}

Fd accept_before(int listen_fd, const Deadline& deadline, SockAddr* peer) {
  while (true) {
    SockAddr a;
    a.len = sizeof a.storage;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      if (peer != nullptr) *peer = a;
      return Fd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw_errno("accept", errno);
    if (deadline.expired()) return Fd();
    pollfd p{listen_fd, POLLIN, 0};
    ::poll(&p, 1, deadline.remaining_ms(1000));
  }
}

namespace {
// One non-blocking connect attempt; returns 0 or an errno.
int try_connect(const SockAddr& a, const Deadline& deadline, Fd* out) {
  Fd fd(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  if (::connect(fd.get(), a.get(), a.len) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms(1000));
    if (rc == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return err;
  }
  set_nodelay(fd.get());
  *out = std::move(fd);
  return 0;
}

// connect_to and connect_to_listener: `refusals` < 0 retries refusals until the deadline.
Fd connect_retrying(const std::string& host, uint16_t port, const Deadline& deadline,
                    const std::string& what, int refusals) {
  int last_err = 0;
  int backoff_ms = 10;
  int refused = 0;
  while (true) {
    std::vector<SockAddr> addrs;
    try {
      addrs = resolve(host, port);
    } catch (const SystemError&) {
      if (deadline.expired()) throw;
    }
    for (const SockAddr& a : addrs) {
      Fd fd;
      last_err = try_connect(a, deadline, &fd);
      if (last_err == 0) return fd;
      if (refusals >= 0 && (last_err == EMFILE || last_err == ENFILE)) {
        throw SystemError(what + ": cannot open a socket: " + std::strerror(last_err));
      }
    }
    if (refusals >= 0 && last_err == ECONNREFUSED && ++refused > refusals) {
      throw PeerError(what + ": " + host + ":" + std::to_string(port) +
                      " refused the connection: nothing listens there any more");
    }
    if (last_err != ECONNREFUSED) refused = 0;
    if (deadline.expired()) {
      throw TimeoutError(what + ": could not connect to " + host + ":" + std::to_string(port) +
                         " before the deadline" +
                         (last_err ? std::string(" (last error: ") + std::strerror(last_err) + ")"
                                   : std::string()));
    }
    ::usleep(static_cast<useconds_t>(std::min(backoff_ms, deadline.remaining_ms())) * 1000);
    backoff_ms = std::min(backoff_ms * 2, 500);
  }
}
}  // namespace

Fd connect_to(const std::string& host, uint16_t port, const Deadline& deadline,
              const std::string& what) {
  return connect_retrying(host, port, deadline, what, -1);
}

Fd connect_to_listener(const std::string& host, uint16_t port, const Deadline& deadline,
                       const std::string& what, int refusals) {
  return connect_retrying(host, port, deadline, what, refusals);
}

void read_full(int fd, void* buf, size_t len, const Deadline& deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw PeerError(what + ": connection closed by the other side");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      throw PeerError(what + ": " + std::strerror(errno));
    }
    if (deadline.expired()) throw TimeoutError(what + ": timed out waiting for data");
    pollfd p2{fd, POLLIN, 0};
    ::poll(&p2, 1, deadline.remaining_ms(1000));
  }
}

void write_full(int fd, const void* buf, size_t len, const Deadline& deadline,
                const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      throw PeerError(what + ": " + std::strerror(errno));
    }
    if (deadline.expired()) throw TimeoutError(what + ": timed out sending");
    pollfd p2{fd, POLLOUT, 0};
    ::poll(&p2, 1, deadline.remaining_ms(1000));
  }
}

SockAddr local_address(int fd) {
  SockAddr a;
  a.len = sizeof a.storage;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len);
  return a;
}

SockAddr peer_address(int fd) {
  SockAddr a;
  a.len = sizeof a.storage;
  getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len);
  return a;
}

namespace {

bool is_loopback(const SockAddr& a) {
  if (a.family() == AF_INET) {
    const in_addr_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr);
    return (ip >> 24) == 127;
  }
  if (a.family() != AF_INET6) return false;
  const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&ip) || (IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127);
}

}  // namespace

bool same_host(int fd) {
  const SockAddr peer = peer_address(fd);
  if (peer.family() != AF_INET && peer.family() != AF_INET6) return false;
  return is_loopback(peer) || peer.ip() == local_address(fd).ip();
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string local_address_towards(const std::string& host) {
  std::vector<SockAddr> addrs;
  try {
    addrs = resolve(host, 9);
  } catch (const Error&) {
    return "";
  }
  for (const SockAddr& a : addrs) {
    Fd fd(::socket(a.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) continue;
    // A UDP connect only picks a route; nothing is sent.
    if (::connect(fd.get(), a.get(), a.len) != 0) continue;
    return local_address(fd.get()).ip();
  }
  return "";
}

namespace {
bool matches(const std::string& name, const std::vector<std::string>& list, bool exact) {
  for (const std::string& p : list) {
    if (exact ? name == p : name.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}
}  // namespace

std::string address_for_interfaces(const std::string& patterns, const std::string& variable) {
  std::string spec = patterns;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') {
    exclude = true;
    spec.erase(0, 1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  std::vector<std::string> list;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) list.push_back(item);
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) throw_errno("getifaddrs", errno);
  std::string v4, v6;
  std::string seen;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    std::string name = i->ifa_name;
    if (seen.find(" " + name + " ") == std::string::npos) seen += " " + name + " ";
    if (matches(name, list, exact) == exclude) continue;
    SockAddr a;
    size_t sz = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&a.storage, i->ifa_addr, sz);
    a.len = static_cast<socklen_t>(sz);
    if (fam == AF_INET && v4.empty()) v4 = a.ip();
    if (fam == AF_INET6 && v6.empty() &&
        !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(&a.storage)->sin6_addr)) {
      v6 = a.ip();
    }
  }
  freeifaddrs(ifs);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  throw ConfigError(variable + "='" + patterns + "' matches no interface with an address; " +
                    "interfaces here:" + seen);
}

}  // namespace chorus::net
