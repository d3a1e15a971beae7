"""gloo against chorus from Python (torch 2.x): one rank of the runs that
bench/compare_torch_backends.sh starts, once per backend.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and the
folder holding torch_chorus on PYTHONPATH for --backend chorus). --tests picks, in order:
  allreduce  torch.distributed.all_reduce (SUM, float32, in place) on 8 B, then 16 B to
             256 MiB times 4 each step (--min-bytes/--max-bytes); -w warm-up calls, then
             N timed back-to-back calls, N smaller for larger sizes; the time per call
             is the average, the maximum over ranks; then one checked call.
  ddp        a training step of seed 000's model (MLP 784-512-512-10), batch 64 a rank,
             random data in memory, SGD lr 1e-3, CrossEntropyLoss, under
             DistributedDataParallel (torch_chorus.DistributedDataParallel for chorus,
             torch's for gloo): forward, backward, step.
  fsdp       the same step with the MLP's hidden width --fsdp-hidden (2048), sharded with
             FSDP2: torch.distributed.fsdp.fully_shard on every Linear and on the root,
             over init_device_mesh("cpu", (world,)).
A test that raises (on any rank) is reported and the next one runs. Rank 0 prints one
machine-readable line per result (other lines start with '#'):
    allreduce BACKEND WORLD SIZE_BYTES TIME_US WRONG_ELEMENTS
    ddp|fsdp BACKEND WORLD SAMPLES_PER_S LOSS
    error BACKEND WORLD TEST[:SIZE_BYTES] MESSAGE
"""
import argparse
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["gloo", "chorus"], required=True)
    p.add_argument("--tests", default="allreduce,ddp,fsdp",
                   help="comma-separated, of allreduce, ddp, fsdp")
    p.add_argument("--quick", action="store_true", help="fewer iterations and steps")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--batch", type=int, default=64, help="samples a rank a step")
    p.add_argument("--fsdp-hidden", type=int, default=2048)
    args = p.parse_args()
    args.tests = [t for t in args.tests.split(",") if t]
    for t in args.tests:
        if t not in ("allreduce", "ddp", "fsdp"):
            p.error(f"unknown test {t!r}")
    return args


def emit(*fields):
    if dist.get_rank() == 0:
        print(" ".join(str(f) for f in fields), flush=True)


def one_line(exc):
    text = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
    return text[:400]


def all_agree_ok(ok):
    """True when every rank's `ok` is true. Agreed through the store, not a collective:
    a call that failed may leave the backend unusable."""
    store = dist.distributed_c10d._get_default_store()
    all_agree_ok.round += 1
    key = f"torch_backends/ok/{all_agree_ok.round}"
    store.add(key + "/bad", 0 if ok else 1)
    store.add(key + "/arrived", 1)
    world = dist.get_world_size()
    deadline = time.monotonic() + 120
    while store.add(key + "/arrived", 0) < world:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return store.add(key + "/bad", 0) == 0


all_agree_ok.round = 0


# all_reduce -------------------------------------------------------------------------

def allreduce_sizes(args):
    sizes = [args.min_bytes] if args.min_bytes < 16 else []
    size = 16
    while size <= args.max_bytes:
        if size >= args.min_bytes:
            sizes.append(size)
        size *= 4
    return sizes


def allreduce_iters(size, quick):
    """Timed calls for a size: many for small ones, a few for large ones."""
    budget, most = (64 << 20, 200) if quick else (1 << 30, 1000)
    return max(3, min(most, budget // size))


def test_allreduce(args, backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.empty(args.max_bytes // 4, dtype=torch.float32)
    try:  # the first calls of a fresh group are slow: not a size's cost
        for _ in range(100 if args.quick else 300):
            dist.all_reduce(buffer[:2])
    except Exception:  # noqa: BLE001  the sizes report it
        pass
    for size in allreduce_sizes(args):
        count = size // 4
        tensor = buffer[:count]
        iters = allreduce_iters(size, args.quick)
        warmup = max(2, min(20, iters // 5))
        try:
            tensor.fill_(rank + 1)
            for _ in range(warmup):
                dist.all_reduce(tensor)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensor)
            seconds = (time.perf_counter() - start) / iters
            tensor.fill_(rank + 1)
            dist.all_reduce(tensor)
            wrong = int((tensor != world * (world + 1) / 2).sum())
            ok, err = True, None
        except Exception as exc:  # noqa: BLE001  reported, the next size runs
            ok, err = False, exc
        if not all_agree_ok(ok):
            emit("error", backend, world, f"allreduce:{size}",
                 one_line(err) if err else "failed on another rank")
            continue
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        wrong_all = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(wrong_all)
        emit("allreduce", backend, world, size, f"{slowest.item() * 1e6:.3f}", wrong_all.item())


# training steps ---------------------------------------------------------------------

def mlp(hidden):
    """Seed 000's model (examples/seeds/seed000_ddp_test.py) at hidden width `hidden`."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def time_steps(model, args, warmup, steps):
    """Samples a second over all ranks (slowest rank's time), and the last loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1234 + rank)
    pool = 8
    xs = torch.rand(pool, args.batch, 1, 28, 28, generator=gen)
    ys = torch.randint(0, 10, (pool, args.batch), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step(i):
        loss = loss_fn(model(xs[i % pool]), ys[i % pool])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for i in range(warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        loss = step(warmup + i)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return steps * args.batch * world / elapsed.item(), float(loss.detach())


def test_ddp(args, backend):
    if backend == "chorus":
        import torch_chorus
        ddp = torch_chorus.DistributedDataParallel
    else:
        from torch.nn.parallel import DistributedDataParallel as ddp
    torch.manual_seed(0)
    model = ddp(mlp(512))
    warmup, steps = (10, 150) if args.quick else (20, 400)
    return time_steps(model, args, warmup, steps)


def test_fsdp(args, backend):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = mlp(args.fsdp_hidden)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    warmup, steps = (3, 10) if args.quick else (4, 30)
    return time_steps(model, args, warmup, steps)


def run_step_test(name, fn, args, backend):
    world = dist.get_world_size()
    try:
        result, err = fn(args, backend), None
    except Exception as exc:  # noqa: BLE001  reported, the next test runs
        result, err = None, exc
        if os.environ.get("TORCH_BACKENDS_TRACEBACK"):
            traceback.print_exc()
    if not all_agree_ok(err is None):
        emit("error", backend, world, name, one_line(err) if err else "failed on another rank")
        return
    emit(name, backend, world, f"{result[0]:.1f}", f"{result[1]:.6f}")


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401  registers the backend
    dist.init_process_group(args.backend, init_method="env://")
    world = dist.get_world_size()
    emit(f"# {args.backend}, {world} ranks, torch {torch.__version__}, tests {','.join(args.tests)}")
    for test in args.tests:
        if test == "allreduce":
            test_allreduce(args, args.backend)
        elif test == "ddp":
            run_step_test("ddp", test_ddp, args, args.backend)
        else:
            run_step_test("fsdp", test_fsdp, args, args.backend)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001  a broken group after a failed test
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
