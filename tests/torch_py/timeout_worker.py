"""One rank that joins a chorus group with init_process_group's timeout of ARGV[1]
seconds and checks that the group's timeout, the one that applies, is ARGV[2] seconds:
a per-call timeout (a barrier's) and, on torch 2, setTimeout are accepted for that one
and for init_process_group's own (which torch may pass back per call), and refused for
any other. Prints "timeout ok"."""
import datetime
import sys

import torch
import torch.distributed as dist

import torch_chorus  # noqa: F401

asked, applies = float(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("chorus", timeout=datetime.timedelta(seconds=asked))
group = dist.distributed_c10d._get_default_group()


def barrier(seconds):
    opts = dist.BarrierOptions()
    opts.timeout = datetime.timedelta(seconds=seconds)
    group.barrier(opts).wait()


def refused(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            assert w in str(e), "%r not in: %s" % (w, e)
        return
    raise AssertionError("not refused: %s" % (words,))


group_ms = "the group's timeout (%d ms" % (applies * 1000)
other = max(applies, asked) + 1
barrier(applies)
barrier(asked)
refused(lambda: barrier(other), "per-call timeout (%d ms)" % (other * 1000), group_ms)
if int(torch.__version__.split(".")[0]) >= 2:
    set_timeout = dist.distributed_c10d._set_pg_timeout
    set_timeout(datetime.timedelta(seconds=applies), group)
    set_timeout(datetime.timedelta(seconds=asked), group)
    refused(lambda: set_timeout(datetime.timedelta(seconds=other), group), "setTimeout", "fixed")
barrier(applies)
print("timeout ok", flush=True)
dist.destroy_process_group()
