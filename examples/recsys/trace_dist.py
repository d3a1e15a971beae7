"""Logs what a program asks of its torch.distributed backend, for torchrec_dlrm.py --trace.

Two views, one line each:

  py  OP ...       a call of a torch.distributed function (the Python API TorchRec uses):
                   tensor shapes and dtypes, split sizes, reduce op, async_op; and
                   `py  wait OP#N` when the program waits on an async call's work.
  c10d OP ...      an operation reaching the process group through the dispatcher (the
                   c10d:: ops every backend serves), from Python or from C++ (DDP's
                   Reducer, functional collectives), as torch's profiler records it with
                   its input shapes and dtypes.

The lines go to $TRACE_DIST_DIR/rank<R>.txt when TRACE_DIST_DIR is set, else to rank
0's stderr.
"""
import functools
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

OPS = ["all_to_all_single", "all_to_all", "all_gather", "all_gather_into_tensor",
       "reduce_scatter", "reduce_scatter_tensor", "all_reduce", "all_reduce_coalesced",
       "broadcast", "reduce", "gather", "scatter", "barrier", "all_gather_object",
       "broadcast_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv",
       "monitored_barrier"]

_out = None
_count = 0
_profiler = None


def _emit(line):
    if _out is not None:
        _out.write(line + "\n")
        _out.flush()


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)}:{str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.Tensor) for v in value):
            return "[" + ", ".join(_describe(v) for v in value) + "]"
        if len(value) > 16 or not all(isinstance(v, (int, float, bool)) for v in value):
            return f"<{type(value).__name__} of {len(value)}: {type(value[0]).__name__}>" \
                if value else "[]"
        return repr(list(value))
    if isinstance(value, dist.ReduceOp) or type(value).__name__ == "RedOpType":
        return str(value).split(".")[-1]
    if isinstance(value, dist.ProcessGroup):
        return f"group(size={value.size()})"
    if value is None or isinstance(value, (int, float, bool, str)):
        return repr(value)
    return type(value).__name__


_pending = {}  # id of an async call's Work -> its label, until it is waited on


def _traced_wait(wait):
    @functools.wraps(wait)
    def traced(work, *args, **kwargs):
        label = _pending.pop(id(work), None)
        if label is not None:
            _emit(f"py  wait {label}")
        return wait(work, *args, **kwargs)
    return traced


def _wrap(name, fn):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        global _count
        _count += 1
        label = f"{name}#{_count}"
        parts = [_describe(a) for a in args]
        parts += [f"{k}={_describe(v)}" for k, v in kwargs.items()]
        _emit(f"py  {label} " + " ".join(parts))
        result = fn(*args, **kwargs)
        if kwargs.get("async_op") and result is not None:
            _pending[id(result)] = label
        return result
    traced.__trace_dist_inner__ = fn
    return traced


def _on_trace(prof):
    for e in prof.events():
        if e.name.startswith("c10d::"):
            args = [f"{list(s)}:{t}" if s else ("TensorList" if t == "TensorList" else repr(c))
                    for s, t, c in zip(e.input_shapes, e.input_dtypes,
                                       e.concrete_inputs or [None] * len(e.input_shapes))]
            _emit(f"c10d {e.name} thread={e.thread} " + " ".join(args))


def install(rank):
    """Wraps the torch.distributed functions and starts recording c10d ops."""
    global _out, _profiler
    where = os.environ.get("TRACE_DIST_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        _out = open(os.path.join(where, f"rank{rank}.txt"), "w")
    elif rank == 0:
        _out = sys.stderr
    for name in OPS:
        fn = getattr(c10d, name, None)
        if fn is None or hasattr(fn, "__trace_dist_inner__"):
            continue
        traced = _wrap(name, fn)
        setattr(c10d, name, traced)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, traced)
    dist.Work.wait = _traced_wait(dist.Work.wait)
    _profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                       record_shapes=True)
    _profiler.__enter__()


def ddp_buckets(model):
    """Logs the buckets of each DDP under `model` (the Reducer's allreduces carry them:
    the profiler cannot show the shapes of a TensorList)."""
    from torch.nn.parallel import DistributedDataParallel
    for name, m in model.named_modules():
        if isinstance(m, DistributedDataParallel):
            data = m._get_ddp_logging_data()
            _emit(f"ddp {name or '.'} bucket_sizes(bytes)={data.get('bucket_sizes')} "
                  f"bucket_cap={data.get('bucket_cap_bytes')}")


def finish():
    """Flushes the last section and stops recording (before the group is destroyed)."""
    global _profiler
    if _profiler is not None:
        _profiler.__exit__(None, None, None)
        _on_trace(_profiler)
        _profiler = None


def mark(text):
    """A section heading in the log; flushes the c10d ops recorded since the last one."""
    global _profiler
    if _profiler is not None:
        _profiler.__exit__(None, None, None)
        _on_trace(_profiler)
    _emit(f"--- {text}")
    _profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                       record_shapes=True)
    _profiler.__enter__()
