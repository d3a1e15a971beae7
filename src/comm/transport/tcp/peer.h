// One peer's streams: the two one-way sockets this rank may share with another rank (`out`
// carries this rank's frames to it, `in` its frames here) and the sends and receives
// queued on each. Plain state: TcpTransport (tcp_transport_impl.h) drives it, posting
// and moving frames in stream.cc and explaining failures in diagnosis.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "comm/common/socket.h"
#include "comm/transport/tcp/frame.h"

namespace chorus::transport::tcp {

struct SendEntry {
  FrameHeader header;
  const uint8_t* data;
  size_t done = 0;  // bytes of header + payload written
};

struct RecvEntry {
  FrameHeader want;
  FrameHeader got;
  uint8_t* data;
  size_t done = 0;  // bytes of header + payload read
};

// Each ordered pair of ranks has its own stream: `out` carries this rank's frames to the
// peer and `in` the peer's frames to this rank. One socket carrying both directions at
// once makes each side's sends queue behind the other's on the socket lock (the kernel
// defers the arriving segments to the lock owner's backlog): on loopback a 1 MiB
// exchange took 1.5x as long as over two one-way sockets.
//
// Both are opened by use (mesh.cc): `out` when this rank first sends to the peer, `in`
// when the peer first sends here (the acceptor hands it over). A peer this rank never
// exchanges with costs no socket.
struct Peer {
  net::Fd out;  // written only by this rank; the peer never writes to it
  net::Fd in;   // read only by this rank
  std::string host;
  std::string address;  // "ip:port", where it listens
  std::string ip;
  uint16_t port = 0;
  bool listed = false;  // in TcpTransport::active_ (sends or receives posted)
  bool linked = false;  // in TcpTransport::linked_ (`out` or `in` open)
  std::deque<SendEntry> sends;
  std::deque<RecvEntry> recvs;
  uint64_t sends_posted = 0, sends_done = 0;
  uint64_t recvs_posted = 0, recvs_done = 0;
  uint32_t p2p_sent = 0, p2p_received = 0;
  bool said_goodbye = false;
  // Whether poll() should watch an idle stream for the peer closing it.
  bool watch_close = true;
  // The operation (TcpTransport::serial_) in which the first frame waiting on the idle
  // stream was checked; while it is the current one, poll() does not watch it for data.
  uint64_t peeked_serial = 0;
};

}  // namespace chorus::transport::tcp
