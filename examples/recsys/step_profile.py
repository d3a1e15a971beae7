"""Where a training step's time goes, on one rank: the step is cut into consecutive
phases on the training thread (each moment belongs to exactly one phase, so the phases
add up to the step), and every collective is logged with the moments this rank issued
it, began to wait for it and had its result.

    prof = StepProfile(rank, world, backend)
    prof.begin_step(step)
    prof.phase("lookup_fwd")           # from now on, time counts to lookup_fwd
    with prof.collective("a2a_fwd"):   # a blocking call: time counts to a2a_fwd
        dist.all_to_all_single(...)
    prof.phase("mlp_fwd")
    ...
    prof.end_step()
    prof.dump(folder)                  # folder/rank<R>.json: {"rank", "world", "backend",
                                       #   "steps": [...]}

instrument(prof) does the same, without touching the program, for the torch.distributed
functions a library (TorchRec) calls: a blocking call is a collective named after the
function and the phase it was called in; an asynchronous one is logged when issued, and
the time its Work's wait() takes is its phase.

Each step is {"step": S, "start": T0, "end": T1, "phases": {name: seconds},
"collectives": [{"name", "issue", "wait", "leave"}]} (wait and leave null for a call
never waited on), times from time.perf_counter(), which on Linux is CLOCK_MONOTONIC:
one clock for every process of the machine, so that bench/recsys_report.py can tell how
much of each wait was for the last rank to issue the call.
"""
import contextlib
import json
import os
import time


class StepProfile:
    def __init__(self, rank, world, backend):
        self.rank, self.world, self.backend = rank, world, backend
        self.steps = []
        self._step = None
        self.current = None  # the open phase
        self._since = None

    def begin_step(self, step):
        now = time.perf_counter()
        self._step = {"step": step, "start": now, "end": None, "phases": {},
                      "collectives": []}
        self.current, self._since = "other", now

    def phase(self, name):
        """Closes the open phase now and opens `name` (no-op outside a step)."""
        if self._step is None:
            return
        now = time.perf_counter()
        phases = self._step["phases"]
        phases[self.current] = phases.get(self.current, 0.0) + (now - self._since)
        self.current, self._since = name, now

    def issued(self, name):
        """A collective issued now; its record, for waiting(). None outside a step."""
        if self._step is None:
            return None
        record = {"name": name, "issue": time.perf_counter(), "wait": None, "leave": None}
        self._step["collectives"].append(record)
        return record

    @contextlib.contextmanager
    def waiting(self, record, then=None):
        """Times the block as the phase of `record`'s collective; afterwards the phase is
        `then` (default: the one open before)."""
        if record is None or self._step is None:
            yield
            return
        before = self.current
        self.phase(record["name"])
        record["wait"] = self._since
        try:
            yield
        finally:
            self.phase(then or before)
            record["leave"] = self._since

    @contextlib.contextmanager
    def collective(self, name, then=None):
        """A blocking collective: issued and waited for in the block."""
        with self.waiting(self.issued(name), then):
            yield

    def end_step(self):
        if self._step is None:
            return
        self.phase("other")
        self._step["end"] = self._since
        self.steps.append(self._step)
        self._step = None

    def dump(self, folder):
        """Writes folder/rank<R>.json (making the folder if it is not there)."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank{self.rank}.json"), "w") as f:
            json.dump({"rank": self.rank, "world": self.world, "backend": self.backend,
                       "steps": self.steps}, f)


class Off:
    """The same calls, doing nothing: a job without --profile pays nothing for them."""

    def begin_step(self, step):
        pass

    def phase(self, name):
        pass

    @contextlib.contextmanager
    def collective(self, name, then=None):
        yield

    def end_step(self):
        pass

    def dump(self, folder):
        pass


COLLECTIVES = ("all_to_all_single", "all_to_all", "all_reduce", "reduce_scatter_tensor",
               "reduce_scatter", "all_gather_into_tensor", "all_gather")


def instrument(prof):
    """Logs the torch.distributed collectives called from Python (by name: a library
    that calls dist.all_to_all_single finds the wrapper) as prof's collectives, named
    FUNCTION/PHASE after the phase open when they were issued. DDP's allreduces come
    from C++ and are not seen: their wait is part of the phase backward runs in."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    pending = {}  # id of an issued call's Work -> its record, until it is waited on

    def wrap(name, fn):
        def wrapped(*args, **kwargs):
            label = f"{name}/{prof.current}"
            if kwargs.get("async_op"):
                record = prof.issued(label)
                work = fn(*args, **kwargs)
                if work is not None and record is not None:
                    pending[id(work)] = record
                return work
            with prof.collective(label):
                return fn(*args, **kwargs)
        return wrapped

    for name in COLLECTIVES:
        fn = getattr(c10d, name)
        wrapped = wrap(name, fn)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)
    plain_wait = dist.Work.wait

    def wait(work, *args, **kwargs):
        with prof.waiting(pending.pop(id(work), None)):
            return plain_wait(work, *args, **kwargs)

    dist.Work.wait = wait
