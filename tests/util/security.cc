#include "util/security.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "comm/common/deadline.h"
#include "comm/common/logging.h"

namespace chorus::test {

using namespace std::chrono_literals;

bool contains_bytes(const Bytes& haystack, const std::string& needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end()) !=
         haystack.end();
}

bool warnings_logged() { return log::enabled(log::kWarn); }

ScopedEnv::~ScopedEnv() {
  for (auto& [name, old] : saved_) {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
}

ScopedEnv& ScopedEnv::set(const std::string& name, const char* value) {
  if (saved_.find(name) == saved_.end()) {
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
  }
  if (value) ::setenv(name.c_str(), value, 1);
  else ::unsetenv(name.c_str());
  return *this;
}

void SecurityAllowListEnv::SetUp() {
  for (const char* v : {"CHORUS_WHITELIST_FILE", "HCCL_WHITELIST_FILE", "HCCL_WHITELIST_DISABLE"})
    env_.set(v, nullptr);
}

TempFile::TempFile(const std::string& name, const std::string& text)
    : path_(std::filesystem::temp_directory_path() /
            ("chorus_security_" + std::to_string(::getpid()) + "_" + name)) {
  std::ofstream(path_) << text;
}

TempFile::~TempFile() { std::filesystem::remove(path_); }

net::Fd connect_from(const std::string& source, uint16_t port) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) net::throw_errno("test: socket", errno);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
    net::throw_errno("test: bind to " + source, errno);
  }
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(port);
  ::inet_pton(AF_INET, kLoopback, &remote.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
    net::throw_errno("test: connect from " + source, errno);
  }
  net::set_nonblocking(fd.get());
  return fd;
}

void send_bytes(int fd, const Bytes& bytes) {
  net::write_full(fd, bytes.data(), bytes.size(), Deadline(10s), "test send");
}

bool closed_by_peer(int fd, std::chrono::milliseconds within) {
  Deadline deadline(within);
  uint8_t buf[4096];
  while (!deadline.expired()) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, deadline.remaining_ms(100));
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace chorus::test
