"""One rank of the shared-bucket DDP suite: torch_chorus.DistributedDataParallel
trained side by side with torch's own DDP (ordinary buckets), both over chorus groups,
on the same data. Every parameter must be equal bit for bit after every step (the
direct path sums in rank order, as the segment path does), and the buckets must be in
node-shared memory exactly when ARGV[1] says so ("shared" or "ordinary"). Prints
"steps N"."""
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import torch_chorus

expect_shared = {"shared": True, "ordinary": False}[sys.argv[1]]
dist.init_process_group("chorus")
rank, n = dist.get_rank(), dist.get_world_size()
PLAIN = dist.new_group(backend="chorus")
steps = 0


class Net(nn.Module):  # two buckets (c and b: 1.0 MiB, bn and a: 1.5 MiB) with bucket_cap_mb=1
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(784, 512)
        self.bn = nn.BatchNorm1d(512)
        self.b = nn.Linear(512, 512)
        self.c = nn.Linear(512, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.bn(self.a(x))))))


def check(cond, what):
    assert cond, "rank %d: %s" % (rank, what)


def compare(plain, shared, what):
    for (name, p), (_, s) in zip(plain.named_parameters(), shared.named_parameters()):
        check(torch.equal(p, s), "%s: parameter %s differs: max |diff| %g" % (what, name, (p - s).abs().max().item()))
    for (name, p), (_, s) in zip(plain.named_buffers(), shared.named_buffers()):
        check(torch.equal(p, s), "%s: buffer %s differs" % (what, name))


def recording(seen):
    def hook(state, bucket):
        seen.append(torch_chorus.in_shared_memory(bucket.buffer()))
        return default_hooks.allreduce_hook(state, bucket)
    return hook


def train(what, ddp_kwargs, batches=6, join_after=None, hook=False, shared_after=None):
    """Trains both for `batches[rank]` steps (an int: the same on every rank); from
    step `join_after` on inside Join (uneven inputs). `shared_after`: whether the
    buckets are node-shared memory at the end (default: as at the start)."""
    global steps
    torch.manual_seed(0)
    base = Net()
    plain = TorchDDP(copy.deepcopy(base), process_group=PLAIN, **ddp_kwargs)
    shared = torch_chorus.DistributedDataParallel(copy.deepcopy(base), **ddp_kwargs)
    check(shared.buckets_in_shared_memory == expect_shared,
          "%s: buckets_in_shared_memory is %s" % (what, shared.buckets_in_shared_memory))
    seen = {"plain": [], "shared": []}
    if hook:
        plain.register_comm_hook(PLAIN, recording(seen["plain"]))
        shared.register_comm_hook(None, recording(seen["shared"]))
    models = [(plain, torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)),
              (shared, torch.optim.SGD(shared.parameters(), lr=0.05, momentum=0.9))]
    mine = batches if isinstance(batches, int) else batches[rank]
    longest = batches if isinstance(batches, int) else max(batches)
    g = torch.Generator().manual_seed(100 + rank)
    data = [(torch.rand(32, 784, generator=g), torch.randint(0, 10, (32,), generator=g))
            for _ in range(longest)]

    def step(ddp, opt, s):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(data[s][0]), data[s][1]).backward()
        opt.step()
        if ddp is shared and ddp_kwargs.get("gradient_as_bucket_view") and shared.buckets_in_shared_memory:
            for name, p in shared.module.named_parameters():
                check(torch_chorus.in_shared_memory(p.grad), "%s step %d: %s.grad is not in shared memory" % (what, s, name))

    for ddp, opt in models:
        start = mine if join_after is None else min(join_after, mine)
        for s in range(start):
            step(ddp, opt, s)
        if join_after is not None:
            with Join([ddp]):
                for s in range(start, mine):
                    step(ddp, opt, s)
    compare(plain.module, shared.module, what)
    after = expect_shared if shared_after is None else shared_after
    check(shared.buckets_in_shared_memory == after,
          "%s: buckets_in_shared_memory is %s after training" % (what, shared.buckets_in_shared_memory))
    if not expect_shared:
        for name, p in shared.module.named_parameters():
            check(not torch_chorus.in_shared_memory(p.grad), "%s: %s.grad is in shared memory" % (what, name))
    if hook:
        check(len(seen["plain"]) > 6 and not any(seen["plain"]),
              "%s: torch's DDP's buckets, shared or not: %s" % (what, seen["plain"]))
        check(seen["shared"] == [expect_shared] * len(seen["plain"]),
              "%s: the hook saw buckets in shared memory: %s" % (what, seen["shared"]))
    steps += 1


train("defaults", {})
train("small buckets, gradient_as_bucket_view", {"bucket_cap_mb": 1, "gradient_as_bucket_view": True})
train("allreduce_hook, small buckets", {"bucket_cap_mb": 1}, hook=True)
train("no broadcast_buffers, find_unused_parameters",
      {"broadcast_buffers": False, "find_unused_parameters": True, "bucket_cap_mb": 1})
if expect_shared:
    # Join after the rebuild (buckets shared): a joined rank allreduces shared zeros.
    uneven = [5 - (r % 3) for r in range(n)]
    train("Join after 3 steps, uneven inputs", {"bucket_cap_mb": 1, "gradient_as_bucket_view": True},
          batches=uneven, join_after=3)
    # Join from the start: torch rebuilds the buckets in ordinary memory, everywhere.
    train("Join from the start, uneven inputs", {"bucket_cap_mb": 1}, batches=uneven, join_after=0,
          shared_after=False)
    ddp = torch_chorus.DistributedDataParallel(Net(), process_group=dist.new_group(backend="gloo"))
    check(not ddp.buckets_in_shared_memory, "a gloo group got shared buckets")
dist.barrier()
print("steps %d" % steps)
dist.destroy_process_group()
