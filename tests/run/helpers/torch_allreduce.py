"""A PyTorch worker for chorusrun's tests (tests/run/torch_programs_test.cc).

env:// start-up with the gloo backend, as a new user writes it; one all_reduce checked
against its closed form; and the variables the launcher gives (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_PORT apart from the launchers' store).
Prints one line "torch rank R of N ok: ..." on success; otherwise names what differs on
stderr and exits 1. Runs as a script or as a module (python -m torch_allreduce).
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist


def fail(what):
    print(f"torch_allreduce (RANK {os.environ.get('RANK')}): {what}", file=sys.stderr, flush=True)
    sys.exit(1)


def check_launcher_variables(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if world != args.expect_world_size:
        fail(f"WORLD_SIZE {world}, expected {args.expect_world_size}")
    if local != rank % local_world or int(os.environ["GROUP_RANK"]) != rank // local_world:
        fail(f"LOCAL_RANK {local} / GROUP_RANK {os.environ['GROUP_RANK']} do not fit RANK {rank}")
    if os.environ["MASTER_PORT"] == os.environ["CHORUS_STORE_PORT"]:
        fail("MASTER_PORT is the launchers' own store port")
    if args.expect_local_rank_arg and args.local_rank != local:
        fail(f"--local_rank {args.local_rank}, expected LOCAL_RANK {local}")
    if not args.expect_local_rank_arg and args.local_rank is not None:
        fail(f"unexpected --local_rank={args.local_rank}")
    return rank, world, local


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=None)
    parser.add_argument("--expect-local-rank-arg", action="store_true")
    parser.add_argument("--expect-world-size", type=int, required=True)
    args = parser.parse_args()
    rank, world, local = check_launcher_variables(args)
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    if dist.get_rank() != rank or dist.get_world_size() != world:
        fail(f"process group says rank {dist.get_rank()} of {dist.get_world_size()}")
    values = torch.full((1000,), float(rank + 1))
    dist.all_reduce(values)
    expected = world * (world + 1) / 2
    if not bool(torch.all(values == expected)):
        fail(f"all_reduce gave {values[:4].tolist()}..., expected {expected}")
    dist.barrier()
    dist.destroy_process_group()
    how = f"module {__spec__.name}" if __spec__ is not None else "script"
    print(f"torch rank {rank} of {world} ok: local rank {local}, MASTER_PORT "
          f"{os.environ['MASTER_PORT']}, store port {os.environ['CHORUS_STORE_PORT']}, "
          f"python {sys.executable}, run as {how}", flush=True)


if __name__ == "__main__":
    main()
