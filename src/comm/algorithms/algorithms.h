// Every collective algorithm of chorus_comm. Each is implemented in its own file and
// runs on the communicator's progress thread; buffers are already validated.
// Byte counts never overflow (the communicator checks count * element size).
#pragma once

#include <cstddef>
#include <span>

#include "comm/algorithms/context.h"

namespace chorus::algorithms {

// ---- allreduce: out = reduce over ranks of in (count elements); in may equal out.
void allreduce_ring(const Context& ctx, const void* in, void* out, size_t count);
void allreduce_recursive_doubling(const Context& ctx, const void* in, void* out, size_t count);
void allreduce_halving_doubling(const Context& ctx, const void* in, void* out, size_t count);

// ---- reduce_scatter (ring): out (count elements) = reduction of block `rank` of in
// (size * count elements). out may alias in's block `rank`.
void reduce_scatter_ring(const Context& ctx, const void* in, void* out, size_t count);

// ---- allgather(v) (ring): out's block r (counts[r] elements at displs[r]) = in of
// rank r. `in` may be out's own block.
void allgatherv_ring(const Context& ctx, const void* in, void* out,
                     std::span<const size_t> counts, std::span<const size_t> displs);

// ---- broadcast: buf on every rank = buf of root.
void broadcast_binomial(const Context& ctx, void* buf, size_t count, int root);
void broadcast_chain(const Context& ctx, void* buf, size_t count, int root);

// ---- reduce: out on root = reduction of in. out is used only on root.
void reduce_binomial(const Context& ctx, const void* in, void* out, size_t count, int root);
void reduce_ring(const Context& ctx, const void* in, void* out, size_t count, int root);

// ---- gather / scatter (direct, root talks to every rank).
void gather_direct(const Context& ctx, const void* in, void* out, size_t count, int root);
void scatter_direct(const Context& ctx, const void* in, void* out, size_t count, int root);

// ---- alltoallv (pairwise exchange); counts and displacements in elements.
void alltoallv_pairwise(const Context& ctx, const void* in, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* out,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs);

// ---- barrier (dissemination).
void barrier_dissemination(const Context& ctx);

// Applies the average on `count` elements when ctx.average is set.
void finish_average(const Context& ctx, void* buf, size_t count);

}  // namespace chorus::algorithms
