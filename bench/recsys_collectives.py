"""The collectives of the recommendation jobs alone, at the sizes those jobs use: one rank
of the runs that bench/compare_recsys.sh starts, once per backend.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and the
folder holding torch_chorus on PYTHONPATH for --backend chorus). For world size W:

  trec_tw_splits   all_to_all_single int64 [3W], no split sizes (TorchRec's exchange of
                   each rank's lengths/values counts and batch size)
  trec_tw_lengths  all_to_all_single int32 [512], splits [512/W] x W
  trec_tw_ids      all_to_all_single int64 [1536], splits [1536/W] x W
  trec_tw_pooled   all_to_all_single float32 [32768], splits [32768/W] x W (the pooled
                   embeddings forward; their gradients backward have the same sizes)
  trec_rw_ids      all_to_all_single int64 [1536] with unequal splits: the ids sent to
                   the rank holding their rows (rows in W equal blocks, ids uniform)
  trec_rw_rs       reduce_scatter_tensor float32 [W*64, 512] -> [64, 512]
  trec_rw_ag       all_gather_into_tensor float32 [64, 512] -> [W*64, 512]
  sharded_a2a      all_to_all_single float32 with dlrm_sharded.py's split sizes at its
                   defaults (8 tables x 64, global batch 1024: [131072] x 2 at W=2,
                   [32768] x 4 at W=4), forward and backward alike
  sparse_ar        all_reduce of one table's sparse gradient in a data-parallel
                   (DDP, sparse=True) version of dlrm_sharded.py: EmbeddingBag(100,000,
                   64, sparse=True) looked up with table 0's ids of the rank's slice of
                   the global batch (about 5.5 ids a bag: nnz about 2,900 at W=2), backward,
                   and weight.grad all_reduced (uncoalesced, as DDP passes it)
  tcp_pair:BYTES   at 2 ranks only, no library: BYTES each way at once over one plain
                   loopback tcp connection (non-blocking sockets), what an all_to_all
                   between two nodes must move at the least: its floor. At 2 ranks
                   every all_to_all above is followed by its floor (the bytes it sends
                   the other rank), printed as `floor BACKEND 2 NAME BYTES US`

TorchRec's sizes are those of examples/recsys/README.md ("What TorchRec asks"):
torchrec_dlrm.py's defaults, 8 tables x 64, batch 64 a rank, 3 ids a feature.

Each op: --warmup calls, then --iters timed calls, each a barrier then the call (waited);
a call's time is the slowest rank's, and the op's the median call. Rank 0 prints
    coll BACKEND WORLD NAME BYTES US
(BYTES: what one rank sends, or for sparse_ar its gradient's indices and values), or
    error BACKEND WORLD NAME MESSAGE
for an op that raised (on every rank, as a refused op does: the next op goes on; where
only some ranks raise, the others wait until the run's deadline).
"""
import argparse
import datetime
import os
import selectors
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "recsys"))
import dlrm_sharded  # noqa: E402  (the hand-sharded job's layout and data, not a copy)

TREC_BATCH, TREC_TABLES, TREC_DIM, TREC_IDS = 64, 8, 64, 3
TREC_ROWS = 20_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["gloo", "chorus"], required=True)
    p.add_argument("--ops", default="trec_tw_splits,trec_tw_lengths,trec_tw_ids,"
                   "trec_tw_pooled,trec_rw_ids,trec_rw_rs,trec_rw_ag,sharded_a2a,sparse_ar")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=40)
    return p.parse_args()


def even(total, world):
    return [total // world] * world


def a2a(out, inp, out_splits=None, in_splits=None):
    def call(group):
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    return call, inp.numel() * inp.element_size(), None


def rw_ids(rank, world):
    """Rank r's ids go to the rank holding their row; every rank draws every rank's ids
    (seeded by that rank) to know what it receives."""
    def sends(r):
        g = torch.Generator().manual_seed(7000 + r)
        ids = torch.randint(0, TREC_ROWS, (TREC_BATCH * TREC_TABLES * TREC_IDS,), generator=g)
        block = (TREC_ROWS + world - 1) // world
        return torch.bincount(ids // block, minlength=world).tolist()
    table = [sends(r) for r in range(world)]
    in_splits = table[rank]
    out_splits = [table[r][rank] for r in range(world)]
    inp = torch.arange(sum(in_splits), dtype=torch.int64)
    out = torch.empty(sum(out_splits), dtype=torch.int64)
    return a2a(out, inp, out_splits, in_splits)


def sharded(rank, world):
    args = dlrm_sharded.parse_args([])
    layout = dlrm_sharded.Layout(args, rank, world)
    inp = torch.randn(sum(layout.in_splits))
    out = torch.empty(sum(layout.out_splits))
    return a2a(out, inp, layout.out_splits, layout.in_splits)


def sparse_gradient(rank, world):
    args = dlrm_sharded.parse_args([])
    layout = dlrm_sharded.Layout(args, rank, world)
    emb = torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True)
    indices, offsets = dlrm_sharded.sparse_batch(args, 0, 0)
    lo, b = layout.start[rank], layout.local[rank]
    # Data parallel: the rank looks up its own slice of the batch only.
    first = int(offsets[lo])
    last = int(offsets[lo + b]) if lo + b < args.batch_size else indices.numel()
    emb(indices[first:last], offsets[lo:lo + b] - first).sum().backward()
    return emb.weight.grad


def sparse_ar(rank, world):
    grad = sparse_gradient(rank, world)
    fresh = [grad.clone()]

    def call(group):
        dist.all_reduce(fresh[0], group=group)
        fresh[0] = grad.clone()  # the sum replaced the input: the next call gets a copy
    nbytes = grad._indices().numel() * 8 + grad._values().numel() * 4
    return call, nbytes, "%d nnz" % grad._nnz()


_pair = []  # the tcp_pair rows' connection, opened by the first


def pair_connection(rank):
    if not _pair:
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            server = socket.create_server(("127.0.0.1", 0))
            server.settimeout(60)
            store.set("recsys_collectives/tcp_pair_port", str(server.getsockname()[1]))
            conn, _ = server.accept()
            server.close()
        else:
            port = int(store.get("recsys_collectives/tcp_pair_port"))
            conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setblocking(False)
        _pair.append(conn)
    return _pair[0]


def tcp_pair(rank, world, nbytes):
    if world != 2:
        raise ValueError("tcp_pair runs on 2 ranks only")
    conn = pair_connection(rank)
    out, into = memoryview(bytearray(nbytes)), memoryview(bytearray(nbytes))
    sel = selectors.DefaultSelector()

    def call(group):
        sent = got = 0
        sel.register(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
        try:
            while sent < nbytes or got < nbytes:
                if not sel.select(timeout=60):
                    raise TimeoutError("tcp_pair: no progress in 60 s")
                if sent < nbytes:
                    try:
                        sent += conn.send(out[sent:])
                    except BlockingIOError:
                        pass
                else:
                    sel.modify(conn, selectors.EVENT_READ)
                if got < nbytes:
                    try:
                        n = conn.recv_into(into[got:])
                    except BlockingIOError:
                        continue
                    if n == 0:
                        raise ConnectionError("tcp_pair: the peer closed the connection")
                    got += n
        finally:
            sel.unregister(conn)
    return call, nbytes, None


def build(name, rank, world):
    if name.startswith("tcp_pair:"):
        return tcp_pair(rank, world, int(name.split(":")[1]))
    if name == "trec_tw_splits":
        return a2a(torch.empty(3 * world, dtype=torch.int64),
                   torch.arange(3 * world, dtype=torch.int64))
    if name == "trec_tw_lengths":
        n = TREC_BATCH * TREC_TABLES
        return a2a(torch.empty(n, dtype=torch.int32), torch.ones(n, dtype=torch.int32),
                   even(n, world), even(n, world))
    if name == "trec_tw_ids":
        n = TREC_BATCH * TREC_TABLES * TREC_IDS
        return a2a(torch.empty(n, dtype=torch.int64), torch.arange(n, dtype=torch.int64),
                   even(n, world), even(n, world))
    if name == "trec_tw_pooled":
        n = TREC_BATCH * TREC_TABLES * TREC_DIM
        return a2a(torch.empty(n), torch.randn(n), even(n, world), even(n, world))
    if name == "trec_rw_ids":
        return rw_ids(rank, world)
    if name in ("trec_rw_rs", "trec_rw_ag"):
        width = TREC_TABLES * TREC_DIM
        part, whole = torch.randn(TREC_BATCH, width), torch.randn(world * TREC_BATCH, width)
        if name == "trec_rw_rs":
            return (lambda g: dist.reduce_scatter_tensor(part, whole, group=g),
                    whole.numel() * 4, None)
        return (lambda g: dist.all_gather_into_tensor(whole, part, group=g),
                part.numel() * 4, None)
    if name == "sharded_a2a":
        return sharded(rank, world)
    if name == "sparse_ar":
        return sparse_ar(rank, world)
    raise SystemExit(f"unknown op {name!r}")


def one_line(exc):
    return f"{type(exc).__name__}: {exc}".replace("\n", " | ")[:300]


def timed(call, group, args):
    for _ in range(args.warmup):
        dist.barrier(group=group)
        call(group)
    times = torch.zeros(args.iters, dtype=torch.float64)
    for i in range(args.iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        call(group)
        times[i] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(times.tolist()) * 1e6


A2A = ("trec_tw_splits", "trec_tw_lengths", "trec_tw_ids", "trec_tw_pooled", "trec_rw_ids",
       "sharded_a2a")


def main():
    args = parse_args()
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401  registers "chorus"
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(args.backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    for name in args.ops.split(","):
        try:
            call, nbytes, note = build(name, rank, world)
            us = timed(call, group, args)
            if rank == 0:
                print(f"coll {args.backend} {world} {name} {nbytes} {us:.1f}"
                      + (f" {note}" if note else ""), flush=True)
            if world == 2 and name in A2A:
                call, peer_bytes, _ = tcp_pair(rank, world, nbytes // 2)
                us = timed(call, group, args)
                if rank == 0:
                    print(f"floor {args.backend} {world} {name} {peer_bytes} {us:.1f}", flush=True)
        except Exception as exc:  # noqa: BLE001  reported in the table; the next op goes on
            if rank == 0:
                print(f"error {args.backend} {world} {name} {one_line(exc)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
