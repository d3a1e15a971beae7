"""One rank of the pending-callbacks suite: rank 0 issues an all_reduce with a Python
callback on its future (as DDP's comm hooks do) and, while the callback is still to run
(rank 1 joins the all_reduce two seconds later), either exits (`exit`, status 0) or
destroys the group (`destroy`, half a second later, once the thread that completes the
future waits in the operation: the callback has run by the time it returns; prints
"destroyed" and the callback's value). Rank 1 prints "rank 1 done"."""
import sys
import time

import torch
import torch.distributed as dist

import torch_chorus  # noqa: F401

mode = sys.argv[1]
dist.init_process_group("chorus")
rank = dist.get_rank()
t = torch.ones(4)
if rank == 0:
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0].sum().item())
    if mode == "destroy":
        time.sleep(0.5)
        dist.destroy_process_group()
        print("destroyed; the callback gave %s" % fut.value(), flush=True)
    sys.exit(0)
time.sleep(2)
dist.all_reduce(t)
print("rank 1 done", flush=True)
dist.destroy_process_group()
