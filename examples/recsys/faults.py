"""Failures on purpose, and how a rank reports one, for the recommendation jobs
(dlrm_sharded.py, torchrec_dlrm.py).

--fail RANK:STEP:PHASE[:SIGNAL] makes rank RANK kill (SIGKILL, the default: `kill`) or
stop (SIGSTOP: `stop`) itself at step STEP, just before it enters PHASE:

  all_to_all  the step's first all_to_all_single (dlrm_sharded.py's butterfly exchange;
              TorchRec's input distribution);
  allreduce   the step's first allreduce of a DDP bucket (a comm hook that then
              allreduces as DDP's own does).

The other ranks are then in, or about to enter, the same operation. The victim says on
stderr what it is about to do. A rank whose step raises prints one line on stderr,

    rank R failed at step S: MESSAGE

(MESSAGE on one line) and exits 1, so that what each survivor said can be read back.
"""
import os
import signal
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

PHASES = ("all_to_all", "allreduce")
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def parse(spec):
    """RANK:STEP:PHASE[:SIGNAL] -> (rank, step, phase, signal name); for argparse's type."""
    parts = spec.split(":")
    if len(parts) == 3:
        parts.append("kill")
    if len(parts) != 4 or parts[2] not in PHASES or parts[3] not in SIGNALS:
        raise ValueError(f"--fail {spec}: expected RANK:STEP:PHASE[:SIGNAL], PHASE one of "
                         f"{', '.join(PHASES)}, SIGNAL kill or stop")
    return int(parts[0]), int(parts[1]), parts[2], parts[3]


def add_argument(parser):
    parser.add_argument("--fail", type=parse, default=None, metavar="RANK:STEP:PHASE[:SIGNAL]",
                        help="rank RANK kills (or stops) itself at step STEP just before "
                             f"PHASE ({', '.join(PHASES)}): a failure test (faults.py)")


class FailPoint:
    """Where this rank fails, if it is the victim. The training loop sets `step`."""

    def __init__(self, spec, rank):
        self.rank = rank
        self.victim, self.at_step, self.phase, self.signal = spec or (-1, -1, None, None)
        self.step = -1
        self.fired = False

    def reach(self, phase):
        """Called just before `phase` runs on this rank: fails here if this is the place."""
        if self.fired or self.rank != self.victim or self.step != self.at_step or phase != self.phase:
            return
        self.fired = True
        print(f"rank {self.rank}: {self.signal} itself at step {self.step}, before its "
              f"{phase}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), SIGNALS[self.signal])

    def install(self, ddp_modules):
        """Wraps dist.all_to_all_single and gives each DDP module an allreduce comm hook
        that passes by reach(); does nothing where no --fail was given."""
        if self.phase == "all_to_all":
            inner = dist.all_to_all_single

            def all_to_all_single(*args, **kwargs):
                self.reach("all_to_all")
                return inner(*args, **kwargs)
            for module in (dist, c10d):  # callers reach it through either
                if module.all_to_all_single is inner:
                    module.all_to_all_single = all_to_all_single
        elif self.phase == "allreduce":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            def allreduce(group, bucket):
                self.reach("allreduce")
                return default_hooks.allreduce_hook(group, bucket)
            for ddp in ddp_modules:
                ddp.register_comm_hook(ddp.process_group, allreduce)


def report_failure(rank, step, error):
    """The one line a rank prints when its step raised; then it exits 1."""
    message = " ".join(str(error).split("\n"))
    print(f"rank {rank} failed at step {step}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
