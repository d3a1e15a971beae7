"""One rank of the failure suite: DDP training on the chorus backend in which rank
VICTIM kills (SIGKILL) or stops (SIGSTOP) itself at step 5. Every other rank must raise
a RuntimeError naming the operation, the rank and the host; it prints
"raised after S s: MESSAGE" (S from the victim's last step, which it wrote to
$CHORUS_PY_DIR/victim) and then checks that the group is broken for good."""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_chorus  # noqa: F401

mode, victim, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
marker = os.path.join(os.environ["CHORUS_PY_DIR"], "victim")
dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=timeout_s))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.rand(64, 784), torch.randint(0, 10, (64,))
try:
    for step in range(100000):
        if step == 5 and rank == victim:
            with open(marker + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(marker + ".tmp", marker)
            os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
except RuntimeError as e:
    raised = time.time()
    with open(marker) as f:
        since = raised - float(f.read())
    print("raised after %.2f s: %s" % (since, str(e).replace("\n", " ")[:600]), flush=True)
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as e2:
        print("then: %s" % str(e2).replace("\n", " ")[:300], flush=True)
        os._exit(3)
    print("then: the group still worked", flush=True)
    os._exit(4)
print("never raised", flush=True)
os._exit(5)
