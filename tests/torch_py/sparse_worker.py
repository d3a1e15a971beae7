"""One rank of the sparse suite: all_reduce of sparse COO tensors on a chorus group
against the same call on a gloo group, over the same inputs. Modes (argv[1]):

  results   every dtype, sparse_dim 1 and 2, with and without dense dimensions,
            overlapping, disjoint and empty (on some ranks, on all) indices: where gloo
            sums, chorus's result is gloo's (same indices, values, sizes, coalesced
            flag, bit for bit), written into the input tensor, which is also the work's
            result and its future's value; where gloo fails, chorus fails too. Then
            the ops and tensors chorus refuses, and the order of a sparse allreduce
            among other collectives issued without waiting.
  mismatch  ranks whose tensors disagree (sizes, dense sizes, sparse_dim, dense_dim,
            dtype): every rank raises, naming itself and a rank that differs, each with
            its tensor; the group stays usable.
  ddp       DDP with sparse embeddings, trained side by side over gloo and chorus:
            parameters equal bit for bit with two ranks, to CHORUS_PY_DDP_RTOL beyond.

Prints "checks N" and exits 0, or raises."""
import copy
import datetime
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_chorus  # noqa: F401  registers "chorus"

MODE = sys.argv[1]
TIMEOUT = datetime.timedelta(seconds=60)  # every wait on the groups ends by then
dist.init_process_group("gloo", timeout=TIMEOUT)
rank, n = dist.get_rank(), dist.get_world_size()
GL = dist.new_group(backend="gloo", timeout=TIMEOUT)
CH = dist.new_group(backend="chorus", timeout=TIMEOUT)
checks = 0

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int32, torch.int64, torch.int16, torch.bool]
# (sizes, sparse_dim): values have the dense sizes sizes[sparse_dim:].
SHAPES = [((50,), 1), ((50, 4), 1), ((7, 9), 2), ((7, 9, 3), 2), ((6, 5, 2, 3), 1)]


def check(cond, what):
    global checks
    assert cond, "rank %d: %s" % (rank, what)
    checks += 1


def random_values(shape, dtype, g):
    if dtype in (torch.float32, torch.float64):  # not integers: the order of the additions shows
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g).to(dtype)


def make(sizes, sparse_dim, dtype, pattern, seed):
    """This rank's tensor: `pattern` overlapping (indices drawn from a few rows, with
    duplicates: uncoalesced), disjoint (each rank its own rows), some_empty (even ranks
    hold nothing) or all_empty."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    nnz = int(torch.randint(3, 12, (1,), generator=g))
    if pattern == "all_empty" or (pattern == "some_empty" and rank % 2 == 0):
        nnz = 0
    if pattern == "disjoint":
        first = torch.arange(nnz) % max(1, sizes[0] // n) + rank * (sizes[0] // n)
    else:
        first = torch.randint(0, min(4, sizes[0]), (nnz,), generator=g)
    rest = [torch.randint(0, s, (nnz,), generator=g) for s in sizes[1:sparse_dim]]
    indices = torch.stack([first, *rest])
    values = random_values((nnz, *sizes[sparse_dim:]), dtype, g)
    return torch.sparse_coo_tensor(indices.long().view(sparse_dim, nnz), values, sizes)


def reduce(t, group):
    """all_reduce of a copy of `t`: (the copy, the work) or (None, the exception)."""
    mine = t.clone()
    try:
        work = dist.all_reduce(mine, group=group, async_op=True)
        work.wait()
        return mine, work
    except RuntimeError as e:
        return None, e


def same_sparse(expected, got, what):
    check(got.is_sparse and got.dtype == expected.dtype and got.shape == expected.shape,
          "%s: %s %s, expected %s %s" % (what, got.dtype, tuple(got.shape), expected.dtype,
                                         tuple(expected.shape)))
    check(got.is_coalesced() == expected.is_coalesced(), "%s: coalesced flag" % what)
    check(torch.equal(got._indices(), expected._indices()), "%s: indices %s, gloo's %s" % (
        what, got._indices().tolist(), expected._indices().tolist()))
    check(torch.equal(got._values(), expected._values()), "%s: values differ from gloo's:\n%s\n%s" % (
        what, got._values(), expected._values()))


def against_gloo(t, what):
    expected, gloo_work = reduce(t, GL)
    got, work = reduce(t, CH)
    if expected is None:
        if got is None:
            return
        # A dtype gloo lacks (its values are small integers, exact in every dtype and
        # order): gloo's sum in float64, converted.
        wide, _ = reduce(t.double(), GL)
        expected = torch.sparse_coo_tensor(wide._indices(), wide._values().to(t.dtype), wide.shape)
        expected._coalesced_(wide.is_coalesced())
        same_sparse(expected, got, what + " (gloo failed: %s)" % str(gloo_work).splitlines()[0])
        return
    check(got is not None, "%s: gloo summed but chorus raised %s" % (what, work))
    same_sparse(expected, got, what)
    # The input tensor holds the sum, and is the result and the future's value, as gloo's.
    check((work.result()[0] is got) == (gloo_work.result()[0] is expected), what + ": result()")
    future_value = work.get_future().value()[0]
    check((future_value is got) == (gloo_work.get_future().value()[0] is expected),
          what + ": the future's value")
    same_sparse(expected, future_value, what + " (future)")


def results():
    seed = 0
    for dtype in DTYPES:
        for sizes, sparse_dim in SHAPES:
            for pattern in ("overlapping", "disjoint", "some_empty", "all_empty"):
                seed += 1
                t = make(sizes, sparse_dim, dtype, pattern, seed)
                against_gloo(t, "%s %s sparse_dim %d %s" % (dtype, sizes, sparse_dim, pattern))
    refusals()
    in_order_among_others()


def raises(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            check(w in str(e), "expected %r in: %s" % (w, e))
        return
    raise AssertionError("rank %d: no error; expected one naming %s" % (rank, words))


def refusals():
    t = make((50, 4), 1, torch.float32, "overlapping", 1)
    for op, name in ((dist.ReduceOp.MAX, "MAX"), (dist.ReduceOp.PRODUCT, "PRODUCT")):
        raises(lambda: dist.all_reduce(t.clone(), op=op, group=CH), "chorus allreduce",
               "ReduceOp." + name, "SUM")
    raises(lambda: dist.all_reduce(make((50,), 1, torch.int16, "overlapping", 1), group=CH),
           "chorus allreduce", "Short", "gloo")
    # Other collectives refuse sparse tensors: chorus naming the layout under torch 1.x;
    # torch 2.x's dispatcher has no sparse kernel of theirs, and refuses them itself.
    torch1 = torch.__version__.startswith("1.")
    raises(lambda: dist.broadcast(t.clone(), 0, group=CH),
           *(("chorus broadcast", "Sparse", "dense") if torch1 else ("broadcast_", "SparseCPU")))
    raises(lambda: dist.all_reduce_coalesced([t.clone()], group=CH),
           *(("chorus allreduce_coalesced", "Sparse") if torch1 else ("allreduce_coalesced_", "SparseCPU")))
    against_gloo(t, "after the refusals")  # they sent nothing: the group is usable


def in_order_among_others():
    """A sparse allreduce's data exchange is issued after its header exchange: issued
    between other collectives without waiting, each still gets its own data."""
    a = make((50, 4), 1, torch.float32, "overlapping", 7)
    b = make((7, 9), 2, torch.float64, "some_empty", 8)
    dense = torch.arange(6, dtype=torch.float32) + rank
    ea, _ = reduce(a, GL)
    eb, _ = reduce(b, GL)
    ca, cb, cd = a.clone(), b.clone(), dense.clone()
    works = [dist.all_reduce(ca, group=CH, async_op=True),
             dist.all_reduce(cd, group=CH, async_op=True),
             dist.all_reduce(cb, group=CH, async_op=True)]
    deadline = time.monotonic() + 60
    while not works[2].is_completed():  # polling alone completes it
        check(time.monotonic() < deadline, "is_completed() still false after 60 s")
        time.sleep(0.001)
    futures = [w.get_future() for w in works]
    for f in futures:
        f.wait()
    same_sparse(ea, ca, "first of three issued at once")
    same_sparse(eb, cb, "third of three issued at once")
    check(torch.equal(cd, sum(torch.arange(6, dtype=torch.float32) + r for r in range(n))),
          "the dense allreduce between them: %s" % cd)


def mismatch():
    last = n - 1
    f32 = torch.float32
    cases = [  # (what, this rank's tensor, what the last rank has, what the others have)
        ("sizes", make((50 + (rank == last), 4), 1, f32, "overlapping", 1),
         "Float[51, 4] (sparse_dim 1, dense_dim 1)", "Float[50, 4] (sparse_dim 1, dense_dim 1)"),
        ("dense sizes", make((50, 4 + (rank == last)), 1, f32, "overlapping", 6),
         "Float[50, 5] (sparse_dim 1, dense_dim 1)", "Float[50, 4] (sparse_dim 1, dense_dim 1)"),
        ("dtype", make((50, 4), 1, torch.float64 if rank == last else f32, "overlapping", 2),
         "Double[50, 4] (sparse_dim 1, dense_dim 1)", "Float[50, 4] (sparse_dim 1, dense_dim 1)"),
        ("sparse_dim", make((7, 9), 1 if rank == last else 2, f32, "overlapping", 3),
         "Float[7, 9] (sparse_dim 1, dense_dim 1)", "Float[7, 9] (sparse_dim 2, dense_dim 0)"),
        ("dense_dim", make((7, 9, 3), 3 if rank == last else 2, f32, "overlapping", 4),
         "Float[7, 9, 3] (sparse_dim 3, dense_dim 0)", "Float[7, 9, 3] (sparse_dim 2, dense_dim 1)"),
    ]
    for what, t, last_has, others_have in cases:
        other = 0 if rank == last else last
        mine, theirs = (last_has, others_have) if rank == last else (others_have, last_has)
        # Both sides, each with its tensor, on every rank.
        raises(lambda: dist.all_reduce(t, group=CH), "chorus allreduce", "disagree",
               "this rank (rank %d) has %s" % (rank, mine), "rank %d has %s" % (other, theirs))
        # Nothing but the headers was sent, on every rank: the group still works.
        against_gloo(make((50, 4), 1, f32, "overlapping", 5), "after a %s mismatch" % what)


class Bags(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.linear = nn.Linear(16, 4)

    def forward(self, indices, offsets):
        if isinstance(self.embedding, nn.EmbeddingBag):
            return self.linear(self.embedding(indices, offsets))
        return self.linear(self.embedding(indices).sum(1))


def ddp():
    rtol = float(os.environ.get("CHORUS_PY_DDP_RTOL", "0" if n == 2 else "1e-5"))
    for what, make_embedding in (
            ("EmbeddingBag", lambda: nn.EmbeddingBag(1000, 16, mode="sum", sparse=True)),
            ("Embedding", lambda: nn.Embedding(1000, 16, sparse=True))):
        torch.manual_seed(0)
        base = Bags(make_embedding())
        models = {}
        for key, group in (("gloo", GL), ("chorus", CH)):
            model = DDP(copy.deepcopy(base), process_group=group)
            models[key] = (model, torch.optim.SGD(model.parameters(), lr=0.1))
        g = torch.Generator().manual_seed(100 + rank)
        for step in range(6):
            # Rows 0-99 drawn by every rank (overlapping), and 100 rows of this rank's own.
            common = torch.randint(0, 100, (32,), generator=g)
            own = 100 + rank * 200 + torch.randint(0, 200, (32,), generator=g)
            indices = torch.cat([common, own])[torch.randperm(64, generator=g)]
            target = torch.randn(8, 4, generator=g)
            for key in ("gloo", "chorus"):
                model, opt = models[key]
                if what == "EmbeddingBag":
                    out = model(indices, torch.arange(0, 64, 8))
                else:
                    out = model(indices.view(8, 8), None)
                nn.functional.mse_loss(out, target).backward()
                opt.step()
                opt.zero_grad()
            for (name, pg), (_, pc) in zip(models["gloo"][0].named_parameters(),
                                           models["chorus"][0].named_parameters()):
                ok = torch.equal(pg, pc) if rtol == 0 else torch.allclose(pg, pc, rtol=rtol, atol=1e-7)
                check(ok, "%s step %d: %s differs from gloo's by %g" % (
                    what, step, name, (pg - pc).abs().max().item()))
        del models


{"results": results, "mismatch": mismatch, "ddp": ddp}[MODE]()
dist.barrier()
print("checks %d" % checks)
gc.collect()  # every group destroyed while the interpreter is whole (see ddp_worker.py)
dist.destroy_process_group()
