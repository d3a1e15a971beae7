"""A DLRM trained with TorchRec's DistributedModelParallel on CPU, on gloo or chorus.

Written in the style of TorchRec's own DLRM examples (examples/golden_training): an
EmbeddingBagCollection of a few tables, torchrec.models.dlrm's DLRM, synthetic click data
from torchrec.datasets.random.RandomRecDataset, the sparse tables sharded by the planner
and updated by a fused optimizer in the backward pass, the dense part under DDP.

Every table is sharded one way (--sharding table_wise or row_wise): table-wise by the
planner under ParameterConstraints, row-wise by a plan written with
construct_module_sharding_plan (the planner offers row-wise on cuda and tpu only). The
tables start from one seeded full copy, whatever the sharding and the world size, so that
runs on gloo and on chorus (and at 2 and 4 ranks) start from the same model. Rank 0 prints one line per step:

    loss step=S value=V global=G

V is rank 0's own loss, G the mean over the ranks (an all_reduce after the step, which
the training itself does not need). At the end each rank prints the sum and the sum of
squares of its parameters (the dense ones and its own shards of the tables):

    params rank=R sum=S sumsq=Q

--fail makes one rank die or stop on purpose; a rank whose step raises prints "rank R
failed at step S: MESSAGE" and exits 1 (faults.py). Rank 0 also prints `samples/s X
(steps 1..N-1, W ranks, BACKEND)`: every rank's samples of steps 1 on over rank 0's time
for them. --profile DIR writes each rank's steps cut into phases (input, forward,
backward, optimizer, loss_allreduce, and the wait of each collective TorchRec calls,
step_profile.py) into DIR/rank<R>.json.

Needs TorchRec and fbgemm-gpu-cpu on PYTHONPATH (and torch_chorus for --backend chorus);
see README.md beside this file.

Run each rank with env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), for example
through python -m torch.distributed.run --nproc-per-node 2 torchrec_dlrm.py.
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.sharding_plan import (construct_module_sharding_plan, row_wise,
                                                table_wise)
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

import faults

SHARDINGS = {"table_wise": ShardingType.TABLE_WISE, "row_wise": ShardingType.ROW_WISE}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["gloo", "chorus"], default="gloo")
    p.add_argument("--sharding", choices=sorted(SHARDINGS), default="table_wise")
    p.add_argument("--plan", choices=["planner", "explicit"], default="planner",
                   help="how table_wise is planned (row_wise is always explicit)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=20_000, help="rows per table")
    p.add_argument("--dim", type=int, default=64, help="embedding dimension")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--batch-skew", type=int, default=0,
                   help="rank R's batches have batch-size + R * skew samples (uneven "
                        "batches: the splits and reduce-scatters become uneven too)")
    p.add_argument("--ids-per-feature", type=int, default=3)
    p.add_argument("--num-dense", type=int, default=13)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--trace", action="store_true",
                   help="log every torch.distributed call on rank 0's stderr (trace_dist.py)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: the process group's timeout (default torch's)")
    faults.add_argument(p)
    p.add_argument("--profile", metavar="DIR",
                   help="write DIR/rank<R>.json: each step's phases (step_profile.py)")
    return p.parse_args(argv)


def table_configs(args):
    return [EmbeddingBagConfig(name=f"t_{i}", embedding_dim=args.dim,
                               num_embeddings=args.rows, feature_names=[f"f_{i}"])
            for i in range(args.tables)]


def build_model(args):
    """The DLRM with its tables on the meta device (DMP allocates each rank's shards)."""
    ebc = EmbeddingBagCollection(tables=table_configs(args), device=torch.device("meta"))
    torch.manual_seed(args.seed)
    dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=args.num_dense,
                dense_arch_layer_sizes=[128, args.dim], over_arch_layer_sizes=[128, 64, 1],
                dense_device=torch.device("cpu"))
    return DLRMTrain(dlrm)


def plan(args, model, sharders, pg):
    """Every table sharded the --sharding way, by the fused (fbgemm TBE) kernel.

    TorchRec's sharders offer row-wise sharding for cuda and tpu only
    (EmbeddingBagCollectionSharder.sharding_types), so its planner finds no plan for
    row_wise on CPU whatever the constraints; the sharding itself has a CPU path, and
    construct_module_sharding_plan (TorchRec's API for a plan written by hand) builds
    it. --plan explicit does the same for table_wise, tables placed round-robin.
    """
    if args.plan == "explicit" or args.sharding == "row_wise":
        return explicit_plan(args, model, pg)
    constraints = {f"t_{i}": ParameterConstraints(
        sharding_types=[SHARDINGS[args.sharding].value],
        compute_kernels=[EmbeddingComputeKernel.FUSED.value]) for i in range(args.tables)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(pg), compute_device="cpu"),
        constraints=constraints)
    return planner.collective_plan(model, sharders, pg)


def explicit_plan(args, model, pg):
    world = dist.get_world_size(pg)
    kernel = EmbeddingComputeKernel.FUSED.value
    per_table = {f"t_{i}": (row_wise(compute_kernel=kernel) if args.sharding == "row_wise"
                            else table_wise(rank=i % world, compute_kernel=kernel))
                 for i in range(args.tables)}
    ebc = model.model.sparse_arch.embedding_bag_collection
    module_plan = construct_module_sharding_plan(ebc, per_table, local_size=world,
                                                 world_size=world, device_type="cpu")
    return ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan})


def full_tables(args):
    """Each table as one seeded tensor, the same for every sharding and world size."""
    g = torch.Generator().manual_seed(args.seed + 1)
    bound = (1.0 / args.rows) ** 0.5
    return {f"t_{i}": torch.empty(args.rows, args.dim).uniform_(-bound, bound, generator=g)
            for i in range(args.tables)}


def load_tables(model, tables):
    """Copies each rank's shards out of the full tables (state_dict's shards are views)."""
    for name, value in model.state_dict().items():
        if not name.endswith(".weight") or "embedding_bags" not in name:
            continue
        table = name.split(".")[-2]
        for shard in value.local_shards():
            r, c = shard.metadata.shard_offsets
            h, w = shard.metadata.shard_sizes
            shard.tensor.copy_(tables[table][r:r + h, c:c + w])


def dataset(args, rank):
    return RandomRecDataset(keys=[f"f_{i}" for i in range(args.tables)],
                            batch_size=args.batch_size + rank * args.batch_skew,
                            hash_size=args.rows,
                            ids_per_feature=args.ids_per_feature, num_dense=args.num_dense,
                            manual_seed=args.seed + 100 + rank, num_batches=args.steps,
                            num_generated_batches=-1)


def checksum(model):
    """Sum and sum of squares (float64) of rank's parameters: dense ones and its shards."""
    total, squares = 0.0, 0.0
    for value in model.state_dict().values():
        parts = ([s.tensor for s in value.local_shards()] if hasattr(value, "local_shards")
                 else [value])
        for t in parts:
            t = t.detach().double()
            total += t.sum().item()
            squares += (t * t).sum().item()
    return total, squares


def train_step(args, step, model, batch, prof):
    """Forward and backward of one step (the tables' optimizer runs in the backward, the
    dense one is the caller's); returns rank's loss and the ranks' sum of it. `prof`
    marks the phases (step_profile.py)."""
    mark = sys.modules["trace_dist"].mark if args.trace else (lambda what: None)
    mark(f"step {step} forward")
    prof.phase("forward")
    loss, _ = model(batch)
    mark(f"step {step} backward")
    prof.phase("backward")
    loss.backward()
    mark(f"step {step} loss all_reduce (the script's, not TorchRec's)")
    prof.phase("loss_allreduce")
    total = loss.detach().clone()
    dist.all_reduce(total)
    prof.phase("optimizer")
    return loss, total


def main(argv):
    args = parse_args(argv)
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401  registers the backend
    rank = int(os.environ["RANK"])
    if args.trace:
        import trace_dist
        trace_dist.install(rank)
    timeout = {} if args.timeout is None else {"timeout": datetime.timedelta(seconds=args.timeout)}
    dist.init_process_group(args.backend, **timeout)
    pg = dist.GroupMember.WORLD
    import step_profile
    prof = step_profile.StepProfile(rank, dist.get_world_size(), args.backend) \
        if args.profile else step_profile.Off()
    world = dist.get_world_size()

    model = build_model(args)
    apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(),
                                {"lr": args.lr})
    sharders = [EmbeddingBagCollectionSharder()]
    sharding_plan = plan(args, model, sharders, pg)
    if rank == 0:
        print(f"plan {sharding_plan}".replace("\n", " | "), file=sys.stderr)
    model = DistributedModelParallel(module=model, device=torch.device("cpu"),
                                     plan=sharding_plan, sharders=sharders)
    load_tables(model, full_tables(args))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=args.lr))

    fail = faults.FailPoint(args.fail, rank)
    fail.install([m for m in model.modules() if isinstance(m, DistributedDataParallel)])
    if args.profile:
        step_profile.instrument(prof)
    model.train()
    batches = iter(dataset(args, rank))
    began = None
    for step in range(args.steps):
        if step == 1:
            began = time.perf_counter()
        fail.step = step
        prof.begin_step(step)
        prof.phase("input")
        batch = next(batches)
        try:
            loss, mean = train_step(args, step, model, batch, prof)
        except RuntimeError as e:
            faults.report_failure(rank, step, e)
        dense.step()
        dense.zero_grad()
        mean /= world
        prof.phase("other")
        if rank == 0:
            print(f"loss step={step} value={loss.item()!r} global={mean.item()!r}", flush=True)
        prof.end_step()
    if began is not None and rank == 0:
        samples = sum(args.batch_size + r * args.batch_skew for r in range(world))
        print(f"samples/s {samples * (args.steps - 1) / (time.perf_counter() - began):.1f} "
              f"(steps 1..{args.steps - 1}, {world} ranks, {args.backend})", flush=True)
    prof.dump(args.profile)  # Off's does nothing
    if args.trace:
        trace_dist.finish()
        trace_dist.ddp_buckets(model)
    total, squares = checksum(model)
    print(f"params rank={rank} sum={total!r} sumsq={squares!r}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
