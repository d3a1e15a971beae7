#!/usr/bin/python3
"""torch.distributed all_reduce (f32 sum) timing on gloo or chorus: the Gloo column of
bench/compare_allreduce.sh, both columns of bench/compare_torch1_backends.sh.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
GLOO_SOCKET_IFNAME=lo) set; needs Debian's python3-torch, so start it with /usr/bin/python3.

For every size from -b to -e (times -f each step) it runs -w warm-up allreduces, then a
barrier, then -n back-to-back torch.distributed.all_reduce calls (synchronous, so each
is issued and waited); the time per op is the average, taken as the maximum over ranks.
torch's all_reduce is in place only. --backend chorus imports torch_chorus (put
build/python on PYTHONPATH). Rank 0 prints one machine-readable line per size:
    size_bytes time_us wrong_elements
Lines starting with '#' are comments. Inputs are rank+1 on every element before each
timed loop; the check runs on a separate single allreduce, since in-place repetition
changes the values.
"""
import argparse
import re
import sys
import time

import torch
import torch.distributed as dist

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    match = re.fullmatch(r"(\d+)([KMGkmg]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad size '{text}' (expected N, NK, NM or NG)")
    return int(match.group(1)) * _SUFFIX[match.group(2).upper()]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--minbytes", type=parse_size, default=8)
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    parser.add_argument("-f", "--stepfactor", type=int, default=2)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("--backend", choices=["gloo", "chorus"], default="gloo")
    args = parser.parse_args()
    if args.stepfactor < 2 or args.iters < 1 or not 4 <= args.minbytes <= args.maxbytes:
        parser.error("need -f >= 2, -n >= 1, 4 <= -b <= -e")
    return args


def sizes(args):
    size = args.minbytes
    while size <= args.maxbytes:
        yield size
        size *= args.stepfactor


def time_allreduce(tensor, args):
    """Average seconds per allreduce on this rank, max over ranks."""
    for _ in range(args.warmup_iters):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(tensor)
    elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def count_wrong(tensor, rank, world):
    """Elements wrong after one allreduce of rank+1, summed over ranks."""
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    wrong = torch.tensor([int((tensor != world * (world + 1) / 2).sum())], dtype=torch.int64)
    dist.all_reduce(wrong)
    return wrong.item()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401  registers the backend
    dist.init_process_group(args.backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.empty(args.maxbytes // 4, dtype=torch.float32)
    if rank == 0:
        print(f"# {args.backend} allreduce f32 sum, {world} ranks: size_bytes time_us wrong", flush=True)
    for size in sizes(args):
        count = size // 4
        tensor = buffer[:count]
        tensor.fill_(rank + 1)
        seconds = time_allreduce(tensor, args)
        wrong = count_wrong(tensor, rank, world)
        if rank == 0:
            print(f"{count * 4} {seconds * 1e6:.3f} {wrong}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
