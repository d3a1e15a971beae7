// Helpers of the security suites (tests/comm/{common,store,transport,communicator}:
// the job token and the allow-list, tested at each layer that checks them): scoped
// environment variables, temporary files, raw loopback connections from a chosen
// source address, and the bytes a peer sends.
//
// Only loopback addresses are used: 127.0.0.1 and, as a second "host", 127.0.0.2 (a
// client socket bound to it before connecting; all of 127.0.0.0/8 is loopback).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "chorus/store.h"
#include "comm/common/socket.h"

namespace chorus::test {

inline constexpr char kLoopback[] = "127.0.0.1";

// Whether `needle`'s bytes occur in `haystack` (a token on the wire, say).
bool contains_bytes(const Bytes& haystack, const std::string& needle);

// Whether warnings reach stderr (CHORUS_LOG_LEVEL): log checks apply only then.
bool warnings_logged();

// Sets environment variables for one test and restores them when destroyed.
class ScopedEnv {
 public:
  ~ScopedEnv();
  // `value` null: unset.
  ScopedEnv& set(const std::string& name, const char* value);

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Tests of the allow-list's variables: starts with none of CHORUS_WHITELIST_FILE,
// HCCL_WHITELIST_FILE and HCCL_WHITELIST_DISABLE set, and restores them after.
class SecurityAllowListEnv : public testing::Test {
 protected:
  void SetUp() override;
  ScopedEnv env_;
};

// A file in the temporary directory holding `text`, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// A TCP connection to 127.0.0.1:`port` from `source` (bound before connecting), made
// non-blocking once connected.
net::Fd connect_from(const std::string& source, uint16_t port);

// Writes every byte within 10 s, or throws.
void send_bytes(int fd, const Bytes& bytes);

// True when the peer closes the connection (end of file or reset) within `within`;
// whatever it sends before is read and dropped.
bool closed_by_peer(int fd, std::chrono::milliseconds within);

}  // namespace chorus::test
