"""One rank that joins a chorus group with its own CHORUS_JOB_TOKEN: ranks whose tokens
differ must refuse each other. Prints "refused: MESSAGE" and exits 3 when
init_process_group raises, "joined" and 0 when it does not."""
import datetime
import os

import torch.distributed as dist

import torch_chorus  # noqa: F401

try:
    dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=20))
except RuntimeError as e:
    print("refused: %s" % str(e).replace("\n", " ")[:500], flush=True)
    os._exit(3)
print("joined", flush=True)
dist.destroy_process_group()
