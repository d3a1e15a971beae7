// The one window that direct shared-memory algorithms (algorithms/shm/) have onto the
// node's segment: the ranks of this node, their buffers in the segment, the phases that
// order them, shared work, and the peers' memory where cross-memory attach is allowed.
// It is exactly what those algorithms call, nothing more. Everything else, point to
// point between local ranks included, goes through the Transport interface
// (transport.h); setting the group up, aborting and closing it belong to whoever owns
// it (the communicator, through ShmGroup).
//
// ShmGroup (shm_group.h) implements it; its header explains the buffers, phases,
// shared work and cross-memory attach that these calls name.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/shared/memory_file.h"

namespace chorus::transport::shm {

// The step (expect()) of a collective that runs on node-shared buffers (the direct
// path): its wire_code() with this bit, so that ranks of which some pass node-shared
// buffers and some do not fail at the first phase, naming both.
inline constexpr uint8_t kSharedStep = 0x80;

class NodeGroup {
 public:
  virtual ~NodeGroup() = default;

  // This rank's index among the node's ranks, and their number.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // Bytes of each of a rank's two buffers.
  virtual size_t buffer_bytes() const = 0;
  // Buffer `which` (0 or 1) of local rank `i`.
  virtual uint8_t* buffer(int i, int which) const = 0;
  // The buffer the next chunk uses: alternates over every chunk of every operation.
  virtual int next_buffer() = 0;

  // Publishes the descriptor of the current operation running `step` (wire_code())
  // with the next arrival, to be compared at the next wait_all().
  virtual void expect(uint8_t step) = 0;
  // A phase: arrive() says "I reached the next phase"; wait_all() returns once every
  // local rank has.
  virtual void arrive() = 0;
  virtual void wait_all() = 0;
  // wait_all() that does not wait: checks at most `polls` times (pausing between, never
  // yielding or sleeping) whether every local rank has arrived; true once they have (and
  // then it has done what wait_all() does on the way out). False: wait_all() is still
  // due for this phase.
  virtual bool poll_all(int polls) = 0;
  // A phase that carries up to kSmallBytes of this rank's data with the arrival, in the
  // cache line the peers read to see it: small_data(i) is local rank i's, from its
  // arrive_small() of the phase passed last (valid until this rank's next arrival).
  static constexpr size_t kSmallBytes = 16;
  virtual void arrive_small(const void* data, size_t bytes) = 0;
  virtual const uint8_t* small_data(int i) const = 0;

  // Shared work: every rank calls begin_work(pieces) with the same count, in the same
  // order, after a phase that all ranks passed and before any rank's next arrival.
  // take_piece() returns the index of a piece nobody else got, or -1 when none is left;
  // finish_piece() publishes the piece's results; wait_work() returns once every piece
  // of the round is finished (their results visible).
  virtual void begin_work(uint64_t pieces) = 0;
  virtual int64_t take_piece() = 0;
  virtual void finish_piece() = 0;
  virtual void wait_work() = 0;

  // Whether every local rank can read every other's memory (cross-memory attach).
  virtual bool cma() const = 0;
  // Whether the node has more local ranks than cores.
  virtual bool oversubscribed() const = 0;
  // Whether it has at least as many local ranks as cores: none is left for work that
  // the ranks' own threads do not do (their progress threads).
  virtual bool no_spare_core() const = 0;
  // Whether the node has more than two local ranks per core.
  virtual bool crowded() const = 0;

  // Publishes this rank's input and output of the current operation; visible to the
  // peers after the next arrive().
  virtual void publish_buffers(const void* in, void* out) = 0;
  // Address of local rank i's published input.
  virtual uint64_t peer_in(int i) const = 0;
  // Copies `bytes` from address `from` in local rank i's memory to `to`. A peer that
  // died or cannot be read becomes PeerError naming the operation and both ranks.
  virtual void read_peer(int i, uint64_t from, void* to, size_t bytes) = 0;

  // Node-shared buffers (include/chorus/shared_memory.h): publishes where this rank's
  // send and recv of the current operation lie (comm/shared/memory_file.h); visible to the peers
  // after the next arrive().
  virtual void publish_shared(const shared::SharedRef& send, const shared::SharedRef& recv) = 0;
  // Local rank i's published send (`which` 0) or recv (1), in this process: its file
  // is mapped on first use. One that cannot be becomes PeerError naming the operation
  // and both ranks.
  virtual uint8_t* peer_shared(int i, int which) = 0;
};

}  // namespace chorus::transport::shm
