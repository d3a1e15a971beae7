"""Runs a seed script as its own __main__ and then prints one line per DDP model it
built: "param-hash rank R model I: SHA256" over the model's parameters, so that the
ranks can be compared. The script itself is not changed.

    run_seed.py SCRIPT [ARGS...]

CHORUS_SEED_STEPS=N stops every DataLoader pass after N batches (a short run for
tests); CHORUS_SEED_BACKEND=NAME starts the script's process group with NAME instead
of the backend it names (the benchmark runs the same script on gloo)."""
import hashlib
import itertools
import os
import runpy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

built = []
_ddp_init = DistributedDataParallel.__init__


def _recording_init(self, *args, **kwargs):
    _ddp_init(self, *args, **kwargs)
    built.append(self)


DistributedDataParallel.__init__ = _recording_init

steps = int(os.environ.get("CHORUS_SEED_STEPS", "0"))
if steps > 0:
    _iter = torch.utils.data.DataLoader.__iter__
    torch.utils.data.DataLoader.__iter__ = lambda self: itertools.islice(_iter(self), steps)

backend = os.environ.get("CHORUS_SEED_BACKEND")
if backend:
    _init_pg = dist.init_process_group

    def _init_with(*args, **kwargs):
        kwargs.pop("backend", None)
        return _init_pg(backend, *args[1:], **kwargs)

    dist.init_process_group = _init_with

if len(sys.argv) < 2:
    sys.exit("usage: run_seed.py SCRIPT [ARGS...]")
script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
for i, model in enumerate(built):
    h = hashlib.sha256()
    for p in model.module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print("param-hash rank %s model %d: %s" % (os.environ.get("RANK", "0"), i, h.hexdigest()),
          flush=True)
