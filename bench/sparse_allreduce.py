"""gloo against chorus on sparse all_reduce (DDP's sparse embedding gradients): one rank
of the runs that bench/compare_sparse_allreduce.sh starts.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set and the
folder holding torch_chorus on PYTHONPATH. Both backends run in the same job, on a gloo
and a chorus group, over the same tensors: a ROWS x COLS float32 table (sparse_dim 1,
values [nnz, COLS]) of which each rank touches DENSITY of the rows, drawn at random
(other rows on each rank, in random order: an uncoalesced tensor, as an embedding's
gradient is). For each density, rounds alternate the backends; each round times
--iters calls of each (a barrier, then all_reduce and wait) on a fresh copy of the
tensor; a call's time is the slowest rank's, and each backend keeps its median call.
The last call's result of each backend is compared (torch.equal on indices and values).
Rank 0 prints one line per density:
    sparse WORLD DENSITY NNZ_PER_RANK GLOO_MS CHORUS_MS EQUAL
"""
import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist

import torch_chorus  # noqa: F401  registers "chorus"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--cols", type=int, default=64)
    p.add_argument("--densities", default="0.001,0.01,0.1,0.5")
    p.add_argument("--iters", type=int, default=10, help="timed calls a backend a round")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def table(args, density, rank):
    g = torch.Generator().manual_seed(1000 * rank + int(density * 1e6))
    nnz = max(1, int(args.rows * density))
    rows = torch.randperm(args.rows, generator=g)[:nnz]
    values = torch.randn(nnz, args.cols, generator=g)
    return torch.sparse_coo_tensor(rows.view(1, -1), values, (args.rows, args.cols))


def timed_call(t, group):
    """(seconds of the slowest rank, the reduced tensor)."""
    mine = t.clone()
    dist.barrier(group=group)
    start = time.perf_counter()
    dist.all_reduce(mine, group=group, async_op=True).wait()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)
    return seconds.item(), mine


def main():
    args = parse_args()
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.new_group(backend="gloo", timeout=timeout),
              "chorus": dist.new_group(backend="chorus", timeout=timeout)}
    for density in (float(d) for d in args.densities.split(",")):
        t = table(args, density, rank)
        times = {name: [] for name in groups}
        results = {}
        for _ in range(args.rounds):
            for name, group in groups.items():
                timed_call(t, group)  # warm-up: allocations of this size
                for _ in range(args.iters):
                    seconds, results[name] = timed_call(t, group)
                    times[name].append(seconds)
        equal = torch.equal(results["gloo"]._indices(), results["chorus"]._indices()) and \
            torch.equal(results["gloo"]._values(), results["chorus"]._values())
        if rank == 0:
            print("sparse %d %g %d %.3f %.3f %s" % (
                world, density, t._nnz(), statistics.median(times["gloo"]) * 1e3,
                statistics.median(times["chorus"]) * 1e3, "yes" if equal else "NO"), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
