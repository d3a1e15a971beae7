"""A DLRM trained without TorchRec, sharded by hand as the reference DLRM's distributed
mode does (facebookresearch/dlrm): model-parallel embedding tables, data-parallel MLPs.

* Tables are placed table-wise: table t lives on rank t % W, nowhere else.
* Every rank generates the same synthetic global batch per step (same seed), looks up
  its own tables for the whole global batch, and one all_to_all_single (the
  "butterfly") sends each rank the pooled embeddings of all tables for its local slice
  of the batch. Its backward is the reverse all_to_all of the gradients.
* The bottom MLP, the dot interaction and the top MLP run on the local slice under DDP.
* Each rank updates its own tables with SGD (dense gradients, or sparse ones with
  --sparse), the MLPs with SGD after DDP's allreduce.

Launch: env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) per rank, e.g. through
run_dlrm_sharded.sh. Rank 0 prints "loss step=S value=V global=G" per step (V: rank 0's
mean loss over its local slice; G: the mean over the global batch), then samples/s and
"checksum value=C" (all parameters summed in float64 over the ranks; the replicated MLP
counted once). --fail makes one rank die or stop on purpose; a rank whose step raises
prints "rank R failed at step S: MESSAGE" and exits 1 (faults.py). With --profile DIR each
rank writes DIR/rank<R>.json: every step cut into phases (step_profile.py), read by
bench/recsys_report.py.
"""
import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import faults
import step_profile

DENSE_FEATURES = 13


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("gloo", "chorus"), default="gloo")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=1024, help="global batch size")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--pooling", type=int, default=10,
                   help="each bag holds 1..POOLING indices (uniformly drawn)")
    p.add_argument("--bot-mlp", default="512-256", help="hidden sizes of the bottom MLP "
                   "(13 -> ... -> dim)")
    p.add_argument("--top-mlp", default="512-256", help="hidden sizes of the top MLP "
                   "(interaction -> ... -> 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--sparse", action="store_true",
                   help="sparse=True embeddings: sparse gradients, SGD on the owner")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds: the process group's timeout (default torch's)")
    faults.add_argument(p)
    p.add_argument("--profile", metavar="DIR",
                   help="write DIR/rank<R>.json: each step's phases (input, lookup_fwd, "
                        "a2a_fwd, mlp_fwd, mlp_bwd, a2a_bwd, lookup_bwd, ddp_wait, "
                        "optimizer, loss_allreduce, other) and its collectives' arrival "
                        "and end times")
    return p.parse_args(argv)


def generator(*key):
    """A generator seeded by a tuple of small ints: the same on every rank."""
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + k + 1) % (1 << 62)
    return torch.Generator().manual_seed(seed)


def dense_batch(args, step):
    """The global batch's dense features and labels (the same on every rank)."""
    g = generator(args.seed, step, 1)
    dense = torch.rand(args.batch_size, DENSE_FEATURES, generator=g)
    # A click rate the model can learn: from the dense features and a little noise.
    noise = torch.rand(args.batch_size, generator=g)
    labels = ((dense[:, :4].sum(1) + noise) > 2.5).float()
    return dense, labels


def sparse_batch(args, step, table):
    """Table `table`'s indices for the global batch: flat indices and bag offsets."""
    g = generator(args.seed, step, 2, table)
    lengths = torch.randint(1, args.pooling + 1, (args.batch_size,), generator=g)
    offsets = torch.zeros(args.batch_size, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    indices = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
    return indices, offsets


def mlp(sizes, last_relu):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def hidden(spec):
    return [int(s) for s in spec.split("-") if s]


class DenseArch(nn.Module):
    """Bottom MLP, dot interaction (pairwise dots of the K+1 vectors, strictly lower
    triangle, beside the bottom MLP's output), top MLP to one logit."""

    def __init__(self, args):
        super().__init__()
        self.bot = mlp([DENSE_FEATURES] + hidden(args.bot_mlp) + [args.dim], last_relu=True)
        n = args.tables + 1
        self.top = mlp([args.dim + n * (n - 1) // 2] + hidden(args.top_mlp) + [1],
                       last_relu=False)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def forward(self, dense, ly):
        x = self.bot(dense)                               # [b, dim]
        t = torch.cat([x.unsqueeze(1), ly], dim=1)         # [b, K+1, dim]
        z = torch.bmm(t, t.transpose(1, 2))                # [b, K+1, K+1]
        r = torch.cat([x, z[:, self.li, self.lj]], dim=1)  # [b, dim + K(K+1)/2]
        return self.top(r).squeeze(1)


class ButterflyAllToAll(torch.autograd.Function):
    """all_to_all_single of a flat tensor with split sizes; backward sends the gradient
    back with the splits swapped, scaled by grad_scale. `prof` times both exchanges
    (a2a_fwd, a2a_bwd); after the backward one the phase is `then` (the lookups'
    backward, or DDP's wait on a rank without tables)."""

    @staticmethod
    def forward(ctx, flat, in_splits, out_splits, group, grad_scale, prof, then):
        ctx.in_splits, ctx.out_splits = in_splits, out_splits
        ctx.group, ctx.grad_scale = group, grad_scale
        ctx.prof, ctx.then = prof, then
        out = flat.new_empty(sum(out_splits))
        flat = flat.contiguous()
        with prof.collective("a2a_fwd", then="mlp_fwd"):
            dist.all_to_all_single(out, flat, out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty(sum(ctx.in_splits))
        grad = grad.contiguous()
        with ctx.prof.collective("a2a_bwd", then=ctx.then):
            dist.all_to_all_single(back, grad, ctx.in_splits, ctx.out_splits,
                                   group=ctx.group)
        if ctx.grad_scale != 1.0:
            back.mul_(ctx.grad_scale)
        return back, None, None, None, None, None, None


class Layout:
    """Who owns which table, which slice of the global batch is whose, and the split
    sizes (in elements) of the butterfly all_to_all."""

    def __init__(self, args, rank, world):
        self.rank, self.world = rank, world
        self.owned = [[t for t in range(args.tables) if t % world == r] for r in range(world)]
        base, extra = divmod(args.batch_size, world)
        self.local = [base + (1 if r < extra else 0) for r in range(world)]
        self.start = [sum(self.local[:r]) for r in range(world)]
        mine = len(self.owned[rank])
        # Send rank j its slice of the batch for my tables; receive my slice for its.
        self.in_splits = [self.local[j] * mine * args.dim for j in range(world)]
        self.out_splits = [self.local[rank] * len(self.owned[j]) * args.dim
                           for j in range(world)]
        # The received blocks hold the tables in the order owned[0] + owned[1] + ...
        order = [t for r in range(world) for t in self.owned[r]]
        self.to_table_order = torch.tensor(sorted(range(len(order)), key=order.__getitem__))


def exchange(pooled, layout, args, group, prof):
    """pooled: my tables' [B, dim] bags for the global batch. Returns [b, K, dim]: every
    table's bags for my slice of the batch, in table order."""
    if pooled:
        flat = torch.stack(pooled, dim=1).reshape(-1)      # [B, mine, dim], batch-major
    else:  # no table here: still take part (and be part of the backward)
        flat = torch.zeros(0, requires_grad=True)
    then = "lookup_bwd" if pooled else "ddp_wait"
    out = ButterflyAllToAll.apply(flat, layout.in_splits, layout.out_splits, group,
                                  1.0 / layout.world, prof, then)
    b = layout.local[layout.rank]
    blocks = torch.split(out, layout.out_splits)
    ly = torch.cat([blk.view(b, len(layout.owned[j]), args.dim)
                    for j, blk in enumerate(blocks)], dim=1)
    return ly.index_select(1, layout.to_table_order)


def build_tables(args, owned):
    tables = nn.ModuleDict()
    bound = (1.0 / args.rows) ** 0.5
    for t in owned:
        emb = nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=args.sparse)
        with torch.no_grad():  # the same table whichever rank holds it
            emb.weight.uniform_(-bound, bound, generator=generator(args.seed, 1_000_000 + t))
        tables[str(t)] = emb
    return tables


def checksum(tables, dense, rank):
    total = torch.zeros(1, dtype=torch.float64)
    for p in tables.parameters():
        total += p.detach().double().sum()
    if rank == 0:  # the MLPs are replicated: count them once
        for p in dense.parameters():
            total += p.detach().double().sum()
    dist.all_reduce(total)
    return total.item()


def train_step(args, step, layout, tables, ddp, group, scale, prof):
    """Forward and backward of one step (the optimizers' steps are the caller's); returns
    this rank's loss sum and the global one (an all_reduce of the ranks' sums). `prof`
    marks the phases (step_profile.py)."""
    rank = layout.rank
    lo, b = layout.start[rank], layout.local[rank]
    prof.phase("input")
    dense, labels = dense_batch(args, step)
    pooled = []
    for t in layout.owned[rank]:
        prof.phase("input")
        indices, offsets = sparse_batch(args, step, t)
        prof.phase("lookup_fwd")
        pooled.append(tables[str(t)](indices, offsets))
    ly = exchange(pooled, layout, args, group, prof)
    logits = ddp(dense[lo:lo + b], ly)
    loss_sum = F.binary_cross_entropy_with_logits(logits, labels[lo:lo + b], reduction="sum")
    prof.phase("mlp_bwd")
    (loss_sum * scale).backward()
    total = torch.tensor([loss_sum.item()], dtype=torch.float64)
    with prof.collective("loss_allreduce", then="optimizer"):
        dist.all_reduce(total)
    return loss_sum, total


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401  registers the backend
    timeout = {} if args.timeout is None else {"timeout": datetime.timedelta(seconds=args.timeout)}
    dist.init_process_group(args.backend, **timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    if args.batch_size < world:
        sys.exit(f"--batch-size {args.batch_size} is below the world size {world}")

    layout = Layout(args, rank, world)
    torch.manual_seed(args.seed)
    dense_arch = DenseArch(args)
    ddp = nn.parallel.DistributedDataParallel(dense_arch, process_group=group)
    tables = build_tables(args, layout.owned[rank])
    opt_dense = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    opt_emb = torch.optim.SGD(tables.parameters(), lr=args.lr) if len(tables) else None
    print(f"rank {rank}: tables {layout.owned[rank]} batch {layout.local[rank]} "
          f"all_to_all send {layout.in_splits} recv {layout.out_splits} floats",
          file=sys.stderr, flush=True)

    prof = step_profile.StepProfile(rank, world, args.backend) if args.profile \
        else step_profile.Off()
    tables_left = [0]  # of this step's backward: tables whose gradient is still to come

    def table_grad_done(grad):
        # The lookups' backward runs last (autograd takes the latest nodes first): once
        # every table has its gradient, what is left of backward is DDP's wait.
        tables_left[0] -= 1
        if tables_left[0] == 0:
            prof.phase("ddp_wait")
        return grad

    if args.profile:
        for emb in tables.values():
            emb.weight.register_hook(table_grad_done)

    fail = faults.FailPoint(args.fail, rank)
    fail.install([ddp])
    b = layout.local[rank]
    scale = world / args.batch_size  # DDP averages: the global mean's gradient
    began = None
    for step in range(args.steps):
        if step == 1:
            began = time.perf_counter()
        fail.step = step
        prof.begin_step(step)
        tables_left[0] = len(tables)
        try:
            loss_sum, total = train_step(args, step, layout, tables, ddp, group, scale, prof)
        except RuntimeError as e:
            faults.report_failure(rank, step, e)
        opt_dense.step()
        opt_dense.zero_grad(set_to_none=True)
        if opt_emb is not None:
            opt_emb.step()
            opt_emb.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"loss step={step} value={loss_sum.item() / b!r} "
                  f"global={total.item() / args.batch_size!r}", flush=True)
        prof.end_step()
    elapsed = time.perf_counter() - began if began is not None else None
    prof.dump(args.profile)  # Off's does nothing
    ck = checksum(tables, dense_arch, rank)
    if rank == 0:
        if elapsed:
            print(f"samples/s {args.batch_size * (args.steps - 1) / elapsed:.1f} "
                  f"(steps 1..{args.steps - 1}, {world} ranks, {args.backend})", flush=True)
        print(f"checksum value={ck!r}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
