"""One rank of the collective suite: every torch.distributed call on a chorus group,
compared with the same call on a gloo group over the same inputs (or, where gloo
lacks the call or the dtype, with the result built from gloo's all_gather of the
inputs). Prints "checks N" and exits 0, or raises."""
import os
import sys

import torch
import torch.distributed as dist

import torch_chorus  # registers "chorus"

R = dist.ReduceOp
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
CH = dist.new_group(backend="chorus")
GL = dist.new_group(backend="gloo")
assert dist.get_backend(CH) == "chorus", dist.get_backend(CH)
checks = 0
TORCH_MAJOR = int(torch.__version__.split(".")[0])
COUNTS = [int(c) for c in os.environ.get("CHORUS_PY_COUNTS", "0,1,7,1000,65537").split(",")]

REDUCED = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int32, torch.int64]
OPS = [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]


def same(expected, got, what):
    global checks
    if isinstance(expected, (list, tuple)):
        assert len(expected) == len(got), what
        for i, (e, g) in enumerate(zip(expected, got)):
            same(e, g, "%s[%d]" % (what, i))
        return
    ok = expected.dtype == got.dtype and expected.shape == got.shape and torch.equal(expected, got)
    assert ok, "%s: rank %d expected %s %s got %s %s" % (
        what, rank, expected.dtype, expected.flatten()[:8], got.dtype, got.flatten()[:8])
    checks += 1


def values(dtype, count, seed, op=R.SUM, of_rank=None):
    """Small integers (exact in every dtype and order) for rank `of_rank`."""
    r = rank if of_rank is None else of_rank
    g = torch.Generator().manual_seed(1000 * seed + r)
    lo, hi = (1, 3) if op == R.PRODUCT else ((0, 4) if dtype in (torch.uint8, torch.bool) else (-3, 4))
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randint(lo, hi, (count,), generator=g).float(),
                             torch.randint(lo, hi, (count,), generator=g).float()).to(dtype)
    return torch.randint(lo, hi, (count,), generator=g).to(dtype)


def gloo_has(fn):
    try:
        fn()
        return True
    except RuntimeError:
        return False


def avg_of(total):
    if total.dtype.is_complex:
        # Each part divided by n, correctly rounded, as chorus does (pairs of reals).
        # torch 2.x's complex-by-real division goes through a complex divide whose
        # rounding differs in the last bit (12/9 for 4/3).
        return torch.complex(total.real / n, total.imag / n)
    if total.dtype.is_floating_point:
        return total / n
    return torch.div(total, n, rounding_mode="trunc").to(total.dtype)


def gathered(t):
    """Every rank's `t`, through gloo's all_gather (bytes for dtypes gloo lacks). Gloo
    1.13 dies of SIGFPE on empty tensors: those it is not given."""
    if t.numel() == 0:
        return [torch.empty_like(t) for _ in range(n)]
    flat = t.contiguous().view(-1).view(torch.uint8)
    out = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(out, flat, group=GL)
    return [o.view(t.dtype).view(t.shape) for o in out]


def local_reduce(parts, op):
    acc = parts[0].clone()
    for p in parts[1:]:
        if op in (R.SUM, R.AVG):
            acc = acc + p
        elif op == R.PRODUCT:
            acc = acc * p if acc.dtype != torch.bool else acc & p
        elif op == R.MIN:
            acc = torch.minimum(acc, p)
        else:
            acc = torch.maximum(acc, p)
    acc = acc.to(parts[0].dtype)
    return avg_of(acc) if op == R.AVG else acc


# --- all_reduce: every dtype x op x count, gloo where it has the pair --------------------
gloo_missing = set()


def gloo_all_reduce(x, op):
    """Gloo's all_reduce of every rank's `x` (SUM then divided for AVG, which gloo
    lacks); from gloo's all_gather where gloo cannot reduce the dtype."""
    ref = x.clone()
    if not gloo_has(lambda: dist.all_reduce(ref, op=R.SUM if op == R.AVG else op, group=GL)):
        gloo_missing.add(str(x.dtype))
        return local_reduce(gathered(x), op)
    return avg_of(ref) if op == R.AVG else ref


for dtype in REDUCED:
    for op in OPS:
        for count in COUNTS:
            x = values(dtype, count, 1, op)
            got = x.clone()
            dist.all_reduce(got, op=op, group=CH)
            same(gloo_all_reduce(x, op), got, "all_reduce %s %s count %d" % (dtype, op, count))
for dtype, ops in [(torch.complex64, [R.SUM, R.AVG]), (torch.complex128, [R.SUM]),
                   (torch.bool, [R.MIN, R.MAX, R.PRODUCT])]:
    for op in ops:
        x = values(dtype, 33, 2, op)
        got = x.clone()
        dist.all_reduce(got, op=op, group=CH)
        same(local_reduce(gathered(x), op), got, "all_reduce %s %s" % (dtype, op))

# --- non-contiguous, async, coalesced ---------------------------------------------------------
base = values(torch.float32, 12, 3).view(3, 4)
nc = base.t()
assert not nc.is_contiguous()
ref = base.clone()
dist.all_reduce(ref, group=GL)
dist.all_reduce(nc, group=CH)
same(ref.t(), nc, "all_reduce non-contiguous")
same(ref, base, "all_reduce non-contiguous writes the viewed storage")
x = values(torch.float64, 999, 4)
w = dist.all_reduce(x, op=R.MAX, group=CH, async_op=True)
w.wait()
assert w.is_completed()
ref = values(torch.float64, 999, 4)
dist.all_reduce(ref, op=R.MAX, group=GL)
same(ref, x, "all_reduce async")
same(ref, w.get_future().value()[0], "all_reduce future value")
ts = [values(torch.float32, c, 5 + c) for c in (3, 0, 17)]
refs = [t.clone() for t in ts]
dist.all_reduce_coalesced(ts, group=CH)
for r_ in refs:
    dist.all_reduce(r_, group=GL)
same(refs, ts, "all_reduce_coalesced")

# --- broadcast, reduce: every root, dtypes chorus does not reduce move as bytes --------------
for dtype in REDUCED + [torch.bool, torch.int16, torch.complex64]:
    for root in range(n):
        for count in (0, 5, 4099):
            x = values(dtype, count, 6 + root, of_rank=rank)
            got, ref = x.clone(), x.clone()
            dist.broadcast(got, root, group=CH)
            dist.broadcast(ref, root, group=GL) if gloo_has(lambda: None) and dtype not in (torch.bool, torch.int16, torch.complex64, torch.bfloat16) else None
            if dtype in (torch.bool, torch.int16, torch.complex64, torch.bfloat16):
                ref = values(dtype, count, 6 + root, of_rank=root)
            same(ref, got, "broadcast %s root %d count %d" % (dtype, root, count))
for root in range(n):
    for op in OPS:
        x = values(torch.int32, 257, 7, op)
        got = x.clone()
        dist.reduce(got, root, op=op, group=CH)
        if rank == root:
            ref = x.clone()
            if op == R.AVG:
                dist.reduce(ref, root, op=R.SUM, group=GL)
                ref = avg_of(ref)
            else:
                dist.reduce(ref, root, op=op, group=GL)
            same(ref, got, "reduce root %d %s" % (root, op))
        elif op != R.AVG:
            dist.reduce(x.clone(), root, op=op, group=GL)
        else:
            dist.reduce(x.clone(), root, op=R.SUM, group=GL)

# --- all_gather (list, into tensor, object, coalesced) ---------------------------------------
for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
    for count in COUNTS:
        x = values(dtype, count, 8)
        got = [torch.empty_like(x) for _ in range(n)]
        ref = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(got, x, group=CH)
        if count:  # gloo dies on empty tensors
            dist.all_gather(ref, x, group=GL)
        same(ref, got, "all_gather %s count %d" % (dtype, count))
        flat = torch.empty(n * count, dtype=dtype)
        dist.all_gather_into_tensor(flat, x, group=CH)
        same(torch.cat(ref), flat, "all_gather_into_tensor %s count %d" % (dtype, count))
x = values(torch.float32, 6, 9).view(2, 3)
got = [torch.empty(3, 2).t() for _ in range(n)]  # non-contiguous outputs
dist.all_gather(got, x, group=CH)
ref = [torch.empty_like(x) for _ in range(n)]
dist.all_gather(ref, x, group=GL)
same(ref, [g.contiguous() for g in got], "all_gather into non-contiguous outputs")
objs = [None] * n
dist.all_gather_object(objs, {"rank": rank, "name": "r%d" % rank}, group=CH)
assert objs == [{"rank": r, "name": "r%d" % r} for r in range(n)], objs
checks += 1
ins = [values(torch.float32, 4, 10), values(torch.float32, 2, 11)]
got = [[torch.empty(4), torch.empty(2)] for _ in range(n)]
dist.all_gather_coalesced(got, ins, group=CH)
ref = [[torch.empty(4), torch.empty(2)] for _ in range(n)]
dist.all_gather_coalesced(ref, ins, group=GL)
same([t for l in ref for t in l], [t for l in got for t in l], "all_gather_coalesced")

# --- gather, scatter ------------------------------------------------------------------------
for root in range(n):
    for count in (0, 3, 5000):
        x = values(torch.float64, count, 12)
        got = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        ref = [torch.empty_like(x) for _ in range(n)] if rank == root else None
        dist.gather(x, got, dst=root, group=CH)
        if count:
            dist.gather(x, ref, dst=root, group=GL)
        if rank == root:
            same(ref, got, "gather root %d count %d" % (root, count))
        parts = [values(torch.int64, count, 13, of_rank=r) for r in range(n)] if rank == root else None
        got = torch.empty(count, dtype=torch.int64)
        ref = torch.empty(count, dtype=torch.int64)
        dist.scatter(got, parts, src=root, group=CH)
        if count:
            dist.scatter(ref, parts, src=root, group=GL)
        same(ref, got, "scatter root %d count %d" % (root, count))

# --- reduce_scatter (gloo 1.13 has none: from gloo's all_gather of the inputs) --------------
for dtype in (torch.float32, torch.bfloat16, torch.int32):
    for op in OPS:
        for count in (0, 1, 7, 3000):
            ins = [values(dtype, count, 14 + r, op) for r in range(n)]
            got = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(got, ins, op=op, group=CH)
            everyone = gathered(torch.cat(ins)) if count else [torch.empty(0, dtype=dtype)] * n
            mine = [e[rank * count:(rank + 1) * count] for e in everyone]
            same(local_reduce(mine, op), got, "reduce_scatter %s %s count %d" % (dtype, op, count))
            got2 = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(got2, torch.cat(ins), op=op, group=CH)
            same(got, got2, "reduce_scatter_tensor %s %s count %d" % (dtype, op, count))

# --- all_gather and reduce_scatter over lists whose sizes differ from rank to rank -----------
# (TorchRec's row-wise sharding with unequal batches: rows of [batch of rank r, dim]).
# Rank r's block has sizes[r] rows; gloo 2.x reduce-scatters such lists but cannot
# all_gather them, gloo 1.13 does neither: the results are built from the inputs.
UNEVEN = {"mild": [3 + 2 * r for r in range(n)],           # padded reduce-scatter
          "one large": [0] * (n - 1) + [40],              # allreduce where n > 2
          "rank 0's empty": [r + 1 if r else 0 for r in range(n)]}
for name, sizes in UNEVEN.items():
    for dtype, op in [(torch.float32, R.SUM), (torch.bfloat16, R.AVG), (torch.int32, R.MAX),
                      (torch.float64, R.PRODUCT)]:
        x = values(dtype, 5 * sizes[rank], 16, op).view(sizes[rank], 5)
        got = [torch.empty(s, 5, dtype=dtype) for s in sizes]
        dist.all_gather(got, x, group=CH)
        same([values(dtype, 5 * s, 16, op, of_rank=r).view(s, 5) for r, s in enumerate(sizes)],
             got, "all_gather uneven %s %s" % (name, dtype))
        ins = [values(dtype, 5 * s, 17 + i, op).view(s, 5) for i, s in enumerate(sizes)]
        out = torch.empty(sizes[rank], 5, dtype=dtype)
        dist.reduce_scatter(out, ins, op=op, group=CH)
        start = sum(sizes[:rank])
        everyone = [torch.cat([values(dtype, 5 * s, 17 + i, op, of_rank=r).view(s, 5)
                               for i, s in enumerate(sizes)]) for r in range(n)]
        same(local_reduce([e[start:start + sizes[rank]] for e in everyone], op), out,
             "reduce_scatter uneven %s %s %s" % (name, dtype, op))
        if name == "mild" and dtype == torch.float32 and TORCH_MAJOR >= 2:
            ref = torch.empty_like(out)
            dist.reduce_scatter(ref, ins, op=op, group=GL)
            same(ref, out, "reduce_scatter uneven %s against gloo" % name)
sizes = UNEVEN["mild"]
got = [torch.empty(5, s).t() for s in sizes]  # non-contiguous outputs
dist.all_gather(got, values(torch.float32, 5 * sizes[rank], 18).view(sizes[rank], 5), group=CH)
same([values(torch.float32, 5 * s, 18, of_rank=r).view(s, 5) for r, s in enumerate(sizes)],
     [g.contiguous() for g in got], "all_gather uneven into non-contiguous outputs")
out = torch.empty(5, sizes[rank]).t()
ins = [values(torch.float32, 5 * s, 19 + i).view(s, 5) for i, s in enumerate(sizes)]
w = dist.reduce_scatter(out, ins, group=CH, async_op=True)
w.wait()
start = sum(sizes[:rank])
same(local_reduce([torch.cat([values(torch.float32, 5 * s, 19 + i, of_rank=r).view(s, 5)
                              for i, s in enumerate(sizes)])[start:start + sizes[rank]]
                   for r in range(n)], R.SUM),
     out.contiguous(), "reduce_scatter uneven async into a non-contiguous output")

# --- all_to_all_single (equal and uneven splits), all_to_all (lists) ------------------------
for count in (0, 1, 300):
    x = values(torch.float32, n * count, 15)
    got, ref = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(got, x, group=CH)
    if count:
        dist.all_to_all_single(ref, x, group=GL)
    same(ref, got, "all_to_all_single count %d" % count)
send_rows = [(rank + p) % 3 + (p == 0) for p in range(n)]  # rows this rank sends to p
recv_rows = [(p + rank) % 3 + (rank == 0) for p in range(n)]
x = values(torch.int64, sum(send_rows) * 2, 16).view(-1, 2)
got = torch.empty(sum(recv_rows), 2, dtype=torch.int64)
ref = torch.empty_like(got)
dist.all_to_all_single(got, x, recv_rows, send_rows, group=CH)
dist.all_to_all_single(ref, x, recv_rows, send_rows, group=GL)
same(ref, got, "all_to_all_single with split sizes")
ins = [values(torch.float32, p + rank + 1, 17) for p in range(n)]
got = [torch.empty(rank + p + 1) for p in range(n)]
dist.all_to_all(got, ins, group=CH)
# Rank p's block for this rank is values(.., rank + p + 1, 17) of rank p (gloo 1.13 has
# no list all_to_all).
expect = [values(torch.float32, rank + p + 1, 17, of_rank=p) for p in range(n)]
same(expect, got, "all_to_all lists")

# --- point to point: send/recv, isend/irecv, batch_isend_irecv ring of 4 MiB ------------------
if n > 1:
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for count in (0, 1, 1 << 20):
        out = values(torch.float32, count, 18)
        inc = torch.empty(count)
        ops = [dist.P2POp(dist.isend, out, nxt, group=CH), dist.P2POp(dist.irecv, inc, prv, group=CH)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        same(values(torch.float32, count, 18, of_rank=prv), inc, "batch_isend_irecv ring count %d" % count)
    if rank % 2 == 0 and rank + 1 < n:
        dist.send(values(torch.int16, 9, 19), rank + 1, group=CH)
        w = dist.irecv(inc := torch.empty(9, dtype=torch.int16), rank + 1, group=CH)
        w.wait()
        same(values(torch.int16, 9, 20, of_rank=rank + 1), inc, "irecv")
    elif rank % 2 == 1:
        inc = torch.empty(9, dtype=torch.int16)
        dist.recv(inc, rank - 1, group=CH)
        same(values(torch.int16, 9, 19, of_rank=rank - 1), inc, "recv")
        dist.isend(values(torch.int16, 9, 20), rank - 1, group=CH).wait()

# --- broadcast_object_list, barrier ----------------------------------------------------------
objs = [{"from": rank}, [rank] * 3] if rank == n - 1 else [None, None]
dist.broadcast_object_list(objs, src=n - 1, group=CH)
assert objs == [{"from": n - 1}, [n - 1] * 3], objs
checks += 1
gathered_objs = [None] * n if rank == 0 else None
dist.gather_object({"r": rank}, gathered_objs, dst=0, group=CH)
if rank == 0:
    assert gathered_objs == [{"r": r} for r in range(n)], gathered_objs
got_obj = [None]
dist.scatter_object_list(got_obj, [("to", r) for r in range(n)] if rank == 0 else None, src=0,
                         group=CH)
assert got_obj == [("to", rank)], got_obj
checks += 2
dist.barrier(group=CH)

# --- the "hccl" alias: scripts written for Ascend reach chorus -------------------------------
torch_chorus.register_as("hccl")
HC = dist.new_group(backend="hccl")
x = torch.tensor([1.0 + rank])
dist.all_reduce(x, group=HC)
same(torch.tensor([n * (n + 1) / 2.0]), x, "all_reduce on a group made with backend='hccl'")
try:
    torch_chorus.register_as("gloo")
    raise AssertionError("register_as('gloo') was accepted")
except ValueError:
    checks += 1

# --- subgroups: even ranks, and every rank alone ----------------------------------------------
evens = list(range(0, n, 2))
sub = dist.new_group(evens, backend="chorus")
alone = [dist.new_group([r], backend="chorus") for r in range(n)]
if rank in evens:
    x = torch.tensor([float(rank)])
    dist.all_reduce(x, group=sub)
    same(torch.tensor([float(sum(evens))]), x, "all_reduce on the even ranks' subgroup")
    ys = [torch.empty(1) for _ in evens]
    dist.all_gather(ys, torch.tensor([rank * 10.0]), group=sub)
    same([torch.tensor([r * 10.0]) for r in evens], ys, "all_gather on the subgroup")
x = torch.tensor([rank + 0.5])
dist.all_reduce(x, group=alone[rank])
same(torch.tensor([rank + 0.5]), x, "all_reduce on a group of one")

# --- bad calls: clear errors, and the group still works after them ----------------------------
def refused(fn, *words):
    global checks
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        msg = str(e)
        for w in words:
            assert w in msg, "%r not in %r" % (w, msg[:500])
        checks += 1
        return
    raise AssertionError("not refused: %s" % (words,))


refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16), group=CH), "allreduce", "Short")
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND, group=CH), "BAND")
# (A tensor on another device never reaches a CPU-only group in 1.13: torch's own
# dispatcher refuses it. CUDA cannot be made in this build.)
refused(lambda: dist.all_gather([torch.empty(3) for _ in range(n)], torch.ones(2), group=CH),
        "allgather", "number of elements")
refused(lambda: dist.all_gather_into_tensor(torch.empty(n * 2 + 1), torch.ones(2), group=CH),
        "allgather_into_tensor")
refused(lambda: dist.all_to_all_single(torch.empty(n), torch.ones(n), [1] * n, [2] * n, group=CH),
        "split sizes")
if n >= 2:
    # Splits that fit each rank's tensors but disagree between ranks: rank 1 expects two
    # elements from rank 0, which sends it one. Every rank raises naming both sides (the
    # others also the rank that found it); the group stays usable.
    expect_rows = [1] * n
    if rank == 1:
        expect_rows[0] = 2
    refused(lambda: dist.all_to_all_single(torch.empty(sum(expect_rows)), torch.ones(n), expect_rows,
                                           [1] * n, group=CH),
            "alltoallv", "rank 0 sends 1 elements to rank 1, which expects 2")
    # The same with lists (all_to_all): the sizes of rank 1's output tensors disagree.
    refused(lambda: dist.all_to_all([torch.empty(k) for k in expect_rows],
                                    [torch.ones(1) for _ in range(n)], group=CH),
            "alltoallv", "rank 0 sends 1 elements to rank 1, which expects 2")
x = torch.ones(3)
dist.all_reduce(x, group=CH)
same(torch.full((3,), float(n)), x, "all_reduce after refused calls")

# --- send/recv with tags and from any source, as torch's own tests do them, on chorus and gloo --
def tags_and_any_source(group):
    """What this rank receives: torch's test_send_recv_with_tag (rank r sends its rank with
    tag r; each receiver asks every sender for that tag), then its test_send_recv_any_source
    (recv and irecv from any source; sourceRank() names the sender), then tags received in
    the reverse of their send order (the later tags wait, held, for their receives)."""
    got = []
    mine = torch.full((10,), float(rank))
    for dst in range(n):
        if dst == rank:
            for src in range(n):
                if src != rank:
                    out = torch.full((10,), -1.0)
                    dist.recv(out, src, group=group, tag=src)
                    assert out.eq(src).all(), (src, out)
                    got.append(("tag", src))
        else:
            dist.send(mine, dst, group=group, tag=rank)
    senders = []
    for dst in range(n):
        if dst == rank:
            for _ in range(n - 1):
                out = torch.full((10,), -1.0)
                sender = dist.recv(out, group=group)
                assert out.eq(sender).all(), (sender, out)
                out = torch.full((10,), -1.0)
                work = dist.irecv(out, group=group)
                work.wait()
                assert out.eq(work._source_rank()).all(), (work._source_rank(), out)
                senders += [sender, work._source_rank()]
        else:
            dist.send(mine, dst, group=group)
            dist.send(mine, dst, group=group)
    got.append(("any", sorted(senders)))
    # Rank 0 sends every other rank tags 1..4 with 1..4 elements; they receive 4..1.
    if rank == 0:
        works = [dist.isend(torch.full((t,), 10.0 * p + t), p, group=group, tag=t)
                 for p in range(1, n) for t in range(1, 5)]
        for w in works:
            w.wait()
    else:
        for t in range(4, 0, -1):
            out = torch.zeros(t)
            dist.recv(out, 0, group=group, tag=t)
            got.append(("reversed", t, out.tolist()))
    return got


if n > 1:
    on_chorus = tags_and_any_source(CH)
    on_gloo = tags_and_any_source(GL)
    assert on_chorus == on_gloo, (on_chorus, on_gloo)
    assert sorted(on_chorus[n - 1][1]) == sorted([r for r in range(n) if r != rank] * 2), on_chorus
    checks += 1

# --- torch 2.x: PREMUL_SUM, the coalesced tensor collectives, coalescing, setTimeout ---------
if TORCH_MAJOR >= 2:
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for factor in (0.5, torch.tensor([0.25], dtype=dtype)):
            x = values(dtype, 1001, 7)
            got = x.clone()
            dist.all_reduce(got, op=dist._make_nccl_premul_sum(factor), group=CH)
            ref = x * factor
            dist.all_reduce(ref, group=GL) if dtype != torch.bfloat16 else None
            if dtype == torch.bfloat16:
                ref = local_reduce(gathered(x * factor), R.SUM)
            same(ref, got, "all_reduce PREMUL_SUM %s factor %s" % (dtype, factor))
            out = torch.empty(2 * 3, dtype=dtype)
            inp = values(dtype, 2 * 3 * n, 8)
            dist.reduce_scatter_tensor(out[:3], inp[: 3 * n], op=dist._make_nccl_premul_sum(factor), group=CH)
            full = local_reduce(gathered(inp[: 3 * n] * factor), R.SUM)
            same(full[3 * rank: 3 * rank + 3], out[:3], "reduce_scatter_tensor PREMUL_SUM %s" % dtype)
    # The coalescing manager sends these as one allgather_into_tensor_coalesced /
    # reduce_scatter_tensor_coalesced call (torch's fast path for DTensor and FSDP2).
    for count_a, count_b in ((0, 5), (1, 1), (7, 1001)):
        ins = [values(torch.float32, count_a, 9), values(torch.float32, count_b, 10)]
        outs = [torch.empty(n * count_a), torch.empty(n * count_b)]
        with dist._coalescing_manager(group=CH, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=CH)
        cm.wait()
        same([torch.cat(gathered(i)) for i in ins], outs, "coalesced all_gather_into_tensor %d,%d" % (count_a, count_b))
        ins = [values(torch.float32, n * count_a, 11, R.AVG), values(torch.float32, n * count_b, 12)]
        outs = [torch.empty(count_a), torch.empty(count_b)]
        with dist._coalescing_manager(group=CH, async_ops=True) as cm:
            dist.reduce_scatter_tensor(outs[0], ins[0], op=R.AVG, group=CH)
            dist.reduce_scatter_tensor(outs[1], ins[1], op=R.AVG, group=CH)
        cm.wait()
        # (torch's manager sends the calls as one, with the first call's op)
        same(local_reduce(gathered(ins[0]), R.AVG)[rank * count_a:(rank + 1) * count_a], outs[0],
             "coalesced reduce_scatter_tensor AVG %d" % count_a)
        same(local_reduce(gathered(ins[1]), R.AVG)[rank * count_b:(rank + 1) * count_b], outs[1],
             "coalesced reduce_scatter_tensor AVG %d" % count_b)
    backend = torch_chorus.chorus_backend(CH)
    assert backend is not None and torch_chorus.chorus_backend(GL) is None
    import datetime
    refused(lambda: dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=7), CH),
            "setTimeout", "fixed")

dist.barrier()
print("checks %d gloo-lacks %s" % (checks, ",".join(sorted(gloo_missing)) or "-"))
dist.destroy_process_group()
