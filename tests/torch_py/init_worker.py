"""One rank that joins a chorus group through init_method ARGV[1] (tcp://HOST:PORT or
file://PATH, with rank and world size from RANK / WORLD_SIZE) and checks an all_reduce
and a broadcast. Prints "init ok". CHORUS_PY_INIT_DELAY: seconds to wait before joining."""
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_chorus  # noqa: F401

rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
time.sleep(float(os.environ.get("CHORUS_PY_INIT_DELAY", "0")))
dist.init_process_group("chorus", init_method=sys.argv[1], rank=rank, world_size=n)
assert dist.get_backend() == "chorus"
x = torch.full((1000,), float(rank + 1))
dist.all_reduce(x)
assert torch.equal(x, torch.full((1000,), n * (n + 1) / 2.0)), x[:4]
y = torch.arange(5) if rank == 0 else torch.zeros(5, dtype=torch.int64)
dist.broadcast(y, 0)
assert torch.equal(y, torch.arange(5)), y
print("init ok", flush=True)
dist.destroy_process_group()
