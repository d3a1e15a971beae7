// The allow-list of peer addresses: which addresses may connect to the store server
// and to a rank's data listener. Connections from other addresses are closed at once
// and logged with their address.
//
// Which list applies (settings::allowlist_file()):
//   CHORUS_WHITELIST_FILE=PATH      that file (the HCCL variables are then ignored)
//   HCCL_WHITELIST_DISABLE=1        no check
//   HCCL_WHITELIST_FILE=PATH        that file
//   none of them                    no check: every address may connect (and must still
//                                   prove the job token)
// HCCL_WHITELIST_DISABLE=0 with no file is an error, as in HCCL.
//
// File format, one entry per line; blank lines and `#` comments (whole line or after
// an entry) are ignored:
//   10.0.0.7            an IPv4 address
//   10.0.1.0/24         an IPv4 network (CIDR); host bits are ignored
//   fd00::7             an IPv6 address
//   fd00::/64           an IPv6 network
// HCCL's JSON file is read too: {"host_ip": ["10.0.0.7", "10.0.0.8"]} (entries may also
// be networks; other keys are ignored). A file that lists no address, or any entry that
// is not one of the above, is a ConfigError naming the file and the line (for JSON, the
// line of a syntax error, or the entry of "host_ip" at fault).
//
// IPv4 peers that reach an IPv6 socket (::ffff:a.b.c.d) are matched as IPv4. Loopback is
// not implied: list 127.0.0.1 when local processes must connect through it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/common/socket.h"

namespace chorus::net {

class AllowList {
 public:
  // Allows every address.
  AllowList() = default;

  // Parses the text of an allow-list. `source` names it in error messages ("FILE" or
  // "FILE (VARIABLE)"). Throws ConfigError "allow-list SOURCE line N: ..." (JSON:
  // "... host_ip entry N: ..." or "... is not valid JSON: ... at line N ...").
  static AllowList parse(const std::string& text, const std::string& source);
  // Reads and parses the file at `path`; `variable` is the setting that named it.
  // Throws ConfigError naming the file when it cannot be read.
  static AllowList load(const std::string& path, const std::string& variable);
  // The list the environment asks for (see the top of this file).
  static AllowList from_env();

  // False when every address is allowed.
  bool restricts() const { return restricts_; }
  bool allows(const SockAddr& address) const;
  // `ip` is a numeric IPv4 or IPv6 address; false for anything else when restricted.
  bool allows_ip(const std::string& ip) const;
  // Number of entries (addresses and networks).
  size_t size() const { return entries_.size(); }
  // "the allow-list /etc/hosts.allow (CHORUS_WHITELIST_FILE)", for messages.
  std::string describe() const;

 private:
  struct Entry {
    int family = 0;                   // AF_INET or AF_INET6
    std::array<uint8_t, 16> bytes{};  // network byte order, masked to `prefix` bits
    int prefix = 0;
  };
  bool allows_bytes(int family, const uint8_t* bytes) const;
  // `where` is "line N" or "host_ip entry N", for messages.
  void add(const std::string& entry, const std::string& source, const std::string& where);

  bool restricts_ = false;
  std::string source_;
  std::vector<Entry> entries_;
};

}  // namespace chorus::net
