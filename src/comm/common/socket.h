// Thin, deadline-aware helpers over BSD sockets, shared by the TCP store and the TCP
// transport. Every blocking helper takes a Deadline; every failure throws a
// chorus::Error whose message names the address involved.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/common/deadline.h"

namespace chorus::net {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

// A non-blocking eventfd that wakes a poll() on another thread: wake() makes it
// readable (best effort: a full counter is already readable). Throws SystemError.
Fd make_wakeup(const char* what);
void wake(int wakeup_fd);

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  std::string ip() const;
  // "1.2.3.4:5" or "[::1]:5".
  std::string str() const;
};

// Resolves host (name or numeric) and port. Throws SystemError naming the host.
std::vector<SockAddr> resolve(const std::string& host, uint16_t port);

// Binds and listens on host:port (port 0: any free port), non-blocking. Throws
// SystemError; "address already in use" names host and port.
Fd listen_on(const std::string& host, uint16_t port, int backlog = 512);

// Accepts one connection before the deadline (nullopt-like invalid Fd on timeout).
// The returned socket is non-blocking with TCP_NODELAY. `peer` receives its address.
Fd accept_before(int listen_fd, const Deadline& deadline, SockAddr* peer);

// Connects to host:port, retrying refused/unreachable attempts until the deadline.
// Returns a non-blocking socket with TCP_NODELAY. Throws TimeoutError naming
// `what` and the address (and the last error seen) when the deadline passes.
Fd connect_to(const std::string& host, uint16_t port, const Deadline& deadline,
              const std::string& what);

// connect_to, for a peer known to listen already (it published its address after it
// started listening): a refusal means nothing listens there any more, so after
// `refusals` retries (10, 20, 40 ms apart) it throws PeerError saying so; running out
// of file descriptors throws SystemError at once (EMFILE, ENFILE: "Too many open files").
Fd connect_to_listener(const std::string& host, uint16_t port, const Deadline& deadline,
                       const std::string& what, int refusals = 3);

// Reads/writes exactly `len` bytes on a non-blocking socket, waiting with poll().
// Throws TimeoutError (deadline), PeerError (peer closed / reset), both prefixed with
// `what`.
void read_full(int fd, void* buf, size_t len, const Deadline& deadline, const std::string& what);
void write_full(int fd, const void* buf, size_t len, const Deadline& deadline,
                const std::string& what);

void set_nonblocking(int fd);
void set_nodelay(int fd);
// The address the socket is bound to.
SockAddr local_address(int fd);
SockAddr peer_address(int fd);
// Whether a connected inet socket's peer is on this host: its address is a loopback one
// (127.0.0.0/8, ::1, or 127.x mapped into IPv6) or the socket's own, so that the
// connection runs over the loopback device. False for other sockets.
bool same_host(int fd);

// This machine's host name.
std::string hostname();

// The local IP address the kernel would use to reach `host` (no packet is sent).
// Empty when there is no route.
std::string local_address_towards(const std::string& host);

// Picks a local IPv4/IPv6 address by interface name patterns, NCCL style:
// "eth,ib" (prefixes), "^docker,lo" (exclude prefixes), "=eth0" (exact names).
// Returns the first match in interface order, IPv4 before IPv6. Throws ConfigError
// naming `variable` when nothing matches.
std::string address_for_interfaces(const std::string& patterns, const std::string& variable);

// Throws SystemError "<what>: <strerror(err)>".
[[noreturn]] void throw_errno(const std::string& what, int err);

}  // namespace chorus::net
