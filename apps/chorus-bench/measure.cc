#include "measure.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "patterns/expected.h"

namespace chorus::bench {
namespace {

// Relative tolerance of a float result: a few roundings of the element type per rank.
double tolerance(DataType dtype, int ranks) {
  switch (dtype) {
    case DataType::kFloat32: return 1e-6 * ranks;
    case DataType::kFloat64: return 1e-14 * ranks;
    case DataType::kFloat16: return 1e-3 * ranks;
    case DataType::kBFloat16: return 8e-3 * ranks;
    default: return 0;  // integers are exact (modulo wrap-around)
  }
}

// Element counts of one row: `count` as printed, `block` per rank, and the lengths of
// this rank's buffers.
struct Shape {
  size_t count, block, send_count, recv_count;
};

Shape shape_of(const CollectiveInfo& info, size_t elements, int rank, int size) {
  if (!info.blocked) {
    bool root_only = info.collective == Collective::kReduce && rank != kRoot;
    return {elements, elements, elements, root_only ? 0 : elements};
  }
  size_t block = elements / size, all = block * size;
  switch (info.collective) {
    case Collective::kAllgather:
    case Collective::kAllgatherv: return {all, block, block, all};
    case Collective::kGather: return {all, block, block, rank == kRoot ? all : 0};
    case Collective::kScatter: return {all, block, rank == kRoot ? all : 0, block};
    case Collective::kReduceScatter: return {all, block, all, block};
    default: return {all, block, all, all};  // alltoall
  }
}

// Where one op reads its input and writes its result: as pointers, or as element
// offsets into the one buffer of an in-place op.
struct Pointers {
  std::byte* in;
  std::byte* out;
};
struct Offsets {
  size_t in, out;
};

// In place, where the input and the result start in the one buffer, in elements, as
// communicator.h spells it ("In place"): allgather(v)'s and gather's send is this rank's
// block of the result (on the root, gather's send == recv + root*count),
// reduce_scatter's and scatter's recv is this rank's block of the input; the other
// collectives pass one pointer twice. Off the root too, gather's send and scatter's recv
// are this rank's block of the buffer (the other pointer is unused there), as in
// nccl-tests.
Offsets in_place_offsets(const Bench& b, const Shape& s) {
  const size_t mine = static_cast<size_t>(b.comm.rank()) * s.block;
  switch (b.info.collective) {
    case Collective::kAllgather:
    case Collective::kAllgatherv:
    case Collective::kGather: return {mine, 0};
    case Collective::kReduceScatter:
    case Collective::kScatter: return {0, mine};
    case Collective::kSend: throw std::logic_error("sendrecv has no in-place form");
    default: return {0, 0};
  }
}

// The buffers one op passes: out of place the send and receive buffers, in place both
// inside the receive buffer.
Pointers pointers(const Bench& b, const Shape& s, bool in_place) {
  if (!in_place) return {b.send.data(), b.recv.data()};
  const Offsets at = in_place_offsets(b, s);
  const size_t elem = dtype_size(b.options.dtype);
  return {b.recv.data() + at.in * elem, b.recv.data() + at.out * elem};
}

Work issue(Bench& b, const Shape& s, const Pointers& p) {
  Communicator& c = b.comm;
  const void* in = p.in;
  void* out = p.out;
  DataType t = b.options.dtype;
  ReduceOp op = b.options.op;
  switch (b.info.collective) {
    case Collective::kAllreduce: return c.allreduce(in, out, s.count, t, op);
    case Collective::kBroadcast: return c.broadcast(in, out, s.count, t, kRoot);
    case Collective::kReduce: return c.reduce(in, out, s.count, t, op, kRoot);
    case Collective::kAllgather: return c.allgather(in, out, s.block, t);
    case Collective::kAllgatherv: {
      const std::vector<size_t> counts(static_cast<size_t>(c.size()), s.block);
      return c.allgatherv(in, s.block, out, counts, {}, t);
    }
    case Collective::kReduceScatter: return c.reduce_scatter(in, out, s.block, t, op);
    case Collective::kAlltoall: return c.alltoall(in, out, s.block, t);
    case Collective::kAlltoallv: {
      const std::vector<size_t> counts(static_cast<size_t>(c.size()), s.block);
      return c.alltoallv(in, counts, {}, out, counts, {}, t);
    }
    case Collective::kGather: return c.gather(in, out, s.block, t, kRoot);
    case Collective::kScatter: return c.scatter(in, out, s.block, t, kRoot);
    case Collective::kSend: {
      // Ops run in issue order: the second one's Work completes after both.
      const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
      if (c.rank() % 2 == 0) {
        c.send(in, s.count, t, next);
        return c.recv(out, s.count, t, prev);
      }
      c.recv(out, s.count, t, prev);
      return c.send(in, s.count, t, next);
    }
    case Collective::kBarrier:
    case Collective::kRecv: break;  // not in --op (options.cc)
  }
  throw std::logic_error("unknown collective");
}

// Average microseconds per op over `iters` back-to-back ops, the maximum over ranks.
// In place every op reads what the one before wrote: no input is restored between ops
// (that copy would be timed with them), so the values grow (a sum over 2 ranks doubles
// each op) and may overflow to inf or wrap around, which costs the reduction kernels
// nothing; the check runs on freshly filled buffers afterwards.
double time_op(Bench& b, const Shape& s, const Pointers& p) {
  for (int i = 0; i < b.options.warmup; ++i) issue(b, s, p).wait();
  b.comm.barrier().wait();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < b.options.iters; ++i) issue(b, s, p).wait();
  std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  double us = elapsed.count() / b.options.iters;
  b.comm.allreduce(&us, 1, DataType::kFloat64, ReduceOp::kMax).wait();
  return us;
}

// Every element of data[0..count) set to -3 (253 for u8): no result of any pattern in
// the places the check reads, so that an element the op did not write counts as wrong.
void poison(void* data, DataType dtype, size_t count) {
  const size_t elem = dtype_size(dtype);
  std::byte one[8];
  patterns::store_element(dtype, one, 0, patterns::is_signed(dtype) ? -3.0 : 253.0);
  for (size_t i = 0; i < count; ++i) std::memcpy(static_cast<std::byte*>(data) + i * elem, one, elem);
}

// This rank's input, elements 0..n of its pattern, into buf: reduce_input() for the
// reducing collectives, move_value() for the others.
void fill_input(const Bench& b, std::byte* buf, size_t n) {
  const Options& o = b.options;
  if (b.info.reduces) {
    patterns::fill_reduce_input(o.dtype, o.op, b.comm.rank(), buf, 0, n);
  } else {
    patterns::fill_move(o.dtype, b.comm.rank(), buf, 0, n);
  }
}

// The wrong elements of this rank's result, at `out`, after one op of shape `s`.
int64_t count_wrong(const Bench& b, const Shape& s, const std::byte* out) {
  const DataType t = b.options.dtype;
  const int rank = b.comm.rank(), size = b.comm.size();
  const size_t block_bytes = s.block * dtype_size(t);
  if (b.info.reduces) {
    const size_t first = b.info.collective == Collective::kReduceScatter ? rank * s.block : 0;
    return static_cast<int64_t>(patterns::ReduceExpectation(t, b.options.op, size)
                                    .count_wrong(out, first, s.recv_count, tolerance(t, size)));
  }
  size_t wrong = 0;
  switch (b.info.collective) {
    case Collective::kBroadcast: wrong = patterns::count_wrong_move(t, kRoot, out, 0, s.recv_count); break;
    case Collective::kSend:
      wrong = patterns::count_wrong_move(t, (rank + size - 1) % size, out, 0, s.recv_count);
      break;
    case Collective::kScatter:
      wrong = patterns::count_wrong_move(t, kRoot, out, rank * s.block, s.recv_count);
      break;
    case Collective::kAllgather:
    case Collective::kAllgatherv:
    case Collective::kGather:  // block j of the result is rank j's send buffer
      for (int j = 0; s.recv_count > 0 && j < size; ++j)
        wrong += patterns::count_wrong_move(t, j, out + j * block_bytes, 0, s.block);
      break;
    case Collective::kAlltoall:
    case Collective::kAlltoallv:  // block j is rank j's block for this rank
      for (int j = 0; j < size; ++j)
        wrong += patterns::count_wrong_move(t, j, out + j * block_bytes, rank * s.block, s.block);
      break;
    default: throw std::logic_error("no check for this collective");
  }
  return static_cast<int64_t>(wrong);
}

// One more op on fresh input, with whatever the op must write poisoned; wrong elements
// summed over ranks. Out of place the send buffer gets its input back (an in-place check
// before poisoned it) and the receive buffer is poisoned. In place the one buffer is
// poisoned, the input filled in at its place (in_place_offsets(), not the pointers that
// were passed) and the result read from its place there, and the send buffer (if any) is
// poisoned: an op that read its input from elsewhere or left its result elsewhere counts
// wrong elements.
int64_t check_op(Bench& b, const Shape& s, bool in_place) {
  const DataType t = b.options.dtype;
  const size_t elem = dtype_size(t);
  std::byte *in = b.send.data(), *out = b.recv.data();
  if (in_place) {
    poison(out, t, s.count);
    if (in != nullptr) poison(in, t, s.count);
    const Offsets at = in_place_offsets(b, s);
    in = b.recv.data() + at.in * elem;
    out = b.recv.data() + at.out * elem;
  } else {
    poison(out, t, s.recv_count);
  }
  fill_input(b, in, s.send_count);
  issue(b, s, pointers(b, s, in_place)).wait();
  int64_t wrong = count_wrong(b, s, out);
  b.comm.allreduce(&wrong, 1, DataType::kInt64, ReduceOp::kSum).wait();
  return wrong;
}

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::kAllreduce: return 2.0 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllgather:
    case Collective::kAllgatherv:
    case Collective::kAlltoall:
    case Collective::kAlltoallv: return static_cast<double>(n - 1) / n;
    default: return 1;
  }
}

// The time and, with --check, the wrong elements of one layout.
Result measure_layout(Bench& b, const Shape& s, size_t bytes, bool in_place) {
  const Pointers p = pointers(b, s, in_place);
  Result r{time_op(b, s, p), 0, 0, std::nullopt};
  r.algbw = r.time_us > 0 ? bytes / (r.time_us * 1e3) : 0;  // GB/s
  r.busbw = r.algbw * bus_factor(b.info.collective, b.comm.size());
  if (b.options.check) r.wrong = check_op(b, s, in_place);
  return r;
}

}  // namespace

void Buffer::allocate(size_t bytes, bool shared) {
  if (shared) {
    shared_ = allocate_shared(std::max<size_t>(bytes, 1));  // it refuses 0 bytes
    data_ = static_cast<std::byte*>(shared_->data());
  } else {
    heap_.resize(bytes);
    data_ = heap_.data();
  }
}

void prepare_buffers(Bench& b) {
  const Options& o = b.options;
  const size_t max_count = o.max_bytes / dtype_size(o.dtype);
  const size_t bytes = max_count * dtype_size(o.dtype);
  if (o.mode != Mode::kIn) b.send.allocate(bytes, o.shared_buffers);
  b.recv.allocate(bytes, o.shared_buffers);
  fill_input(b, o.mode == Mode::kIn ? b.recv.data() : b.send.data(), max_count);
}

Row measure_size(Bench& b, uint64_t bytes) {
  const Options& o = b.options;
  size_t elem = dtype_size(o.dtype);
  Shape s = shape_of(b.info, bytes / elem, b.comm.rank(), b.comm.size());
  Row r{s.count * elem, s.count, nullptr, std::nullopt, std::nullopt};
  r.algo = algorithm_name(b.comm.algorithm_for(b.info.collective, r.bytes));
  if (o.mode != Mode::kIn) r.out = measure_layout(b, s, r.bytes, false);
  if (o.mode != Mode::kOut && b.info.in_place) r.in = measure_layout(b, s, r.bytes, true);
  return r;
}

}  // namespace chorus::bench
