"""chorus as a torch.distributed backend.

``import torch_chorus`` registers the backend ``"chorus"``::

    import torch.distributed as dist
    import torch_chorus
    dist.init_process_group(backend="chorus")          # env://, tcp:// or file://

Collectives on CPU tensors then run on chorus's communicators (shared memory inside a
node, tcp across nodes); only the rendezvous goes through torch's store. See
docs/pytorch.md in chorus's repository.

``torch_chorus.register_as("hccl")`` also sends ``backend="hccl"`` (or any other
name torch does not know) to chorus, for scripts written for another backend.

``torch_chorus.DistributedDataParallel`` is torch's, with its gradient buckets in
node-shared memory where that makes chorus's allreduce faster (see its docstring).
"""
import atexit
import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP


def _version_tuple(text):
    return tuple(int(x) for x in text.split("+")[0].split(".")[:2])


# The torch releases torch_chorus is built and tested against (docs/pytorch.md):
# Debian's 1.13 and 2.7 to 2.15 from PyPI (C++11 ABI, Backend API with coalescing).
SUPPORTED_TORCH = ((1, 13), (2, 7), (2, 15))
_running = _version_tuple(torch.__version__)
if not (_running == SUPPORTED_TORCH[0] or SUPPORTED_TORCH[1] <= _running <= SUPPORTED_TORCH[2]):
    raise ImportError(
        "torch_chorus supports torch 1.13 and 2.7 to 2.15; this Python runs torch %s"
        % torch.__version__)

from . import _C  # noqa: E402

if _version_tuple(_C.torch_version) != _running:  # major.minor: the C++ API changes between them
    raise ImportError(
        "torch_chorus was built against torch %s but this Python runs torch %s: rebuild it "
        "in this environment (pip install --no-build-isolation <chorus>)"
        % (_C.torch_version, torch.__version__))

__all__ = ["ProcessGroupChorus", "register_as", "BACKEND", "DistributedDataParallel",
           "in_shared_memory", "chorus_backend"]

BACKEND = "chorus"
ProcessGroupChorus = _C.ProcessGroupChorus


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout)


def _create_extended(opts, backend_options):
    """torch 2.x's extended creator: the group's own store, rank and size (a subgroup
    or a DeviceMesh dimension is created among its members only) and its timeout."""
    return _C.create_process_group(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def register_as(name):
    """Registers chorus under `name` as well (e.g. "hccl"); a name torch already has
    (gloo, nccl, mpi, ucc) or one registered before raises ValueError."""
    key = name.upper()
    if hasattr(dist.Backend, key) or key in getattr(dist.Backend, "_plugins", {}):
        raise ValueError(f"torch_chorus: the backend name {name!r} is taken")
    if _C.torch_version_major >= 2:
        # For CPU tensors: "chorus" alone, or beside another backend for another device
        # ("cpu:chorus,cuda:nccl").
        dist.Backend.register_backend(name, _create_extended, extended_api=True, devices=["cpu"])
    else:
        dist.Backend.register_backend(name, _create)


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    register_as(BACKEND)


in_shared_memory = _C.in_shared_memory


def _shared_buckets_possible(group):
    """Whether DDP over `group` should keep its buckets in node-shared memory: a chorus
    group whose collectives on such memory take the direct path (the same answer on
    every rank, as the direct path needs), and the allocator that serves it in place."""
    backend = chorus_backend(group)
    return (backend is not None and backend.direct_path_possible()
            and _C.shared_allocator_installed)


def chorus_backend(group=None):
    """The ProcessGroupChorus behind `group` (the default group when None) for CPU
    tensors, or None when chorus does not serve them. On torch 1.x the group is the
    backend; on 2.x a ProcessGroup holds a backend per device type, and chorus is the
    CPU one of "chorus" and of "cpu:chorus,cuda:nccl" alike."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, _C.ProcessGroupChorus):
        return group
    get = getattr(group, "_get_backend", None)
    if get is None:
        return None
    try:
        backend = get(torch.device("cpu"))
    except RuntimeError:  # no backend for CPU tensors in this group
        return None
    return backend if isinstance(backend, _C.ProcessGroupChorus) else None


def _drain_at_exit():
    """Lets every chorus group's pending futures complete and their callbacks run while
    Python still lets other threads take the GIL. After this (at exit, once Python
    finalizes) a thread that asks for the GIL ends inside C++, and one completing a
    future with a Python callback (a DDP comm hook's, Future.then's) would abort the
    process: a job that raised on a failed collective and exited would end in SIGABRT
    instead of its own status. Each group waits at most its timeout."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)  # torch 2.x; 1.13 keeps the map in _pg_map
    groups = world.pg_map if world is not None else getattr(c10d, "_pg_map", {})
    for group in list(groups):
        backend = chorus_backend(group)
        if backend is not None:
            backend._drain_callbacks()


atexit.register(_drain_at_exit)


class _Scope:
    """While active, this thread's large CPU tensors are node-shared memory."""

    def __init__(self, active):
        self.inner = _C.SharedAllocations() if active else None

    def __enter__(self):
        if self.inner is not None:
            self.inner.__enter__()

    def __exit__(self, *exc):
        if self.inner is not None:
            self.inner.__exit__(*exc)


class DistributedDataParallel(_TorchDDP):
    """torch's DistributedDataParallel (same arguments, same behaviour), with the
    gradient buckets in node-shared memory when its group is a chorus group whose ranks
    all share one node in shared memory (not CHORUS_TRANSPORT=tcp, not
    CHORUS_SHM_DIRECT=0): the buckets' allreduce then reads and writes the peers'
    buckets directly instead of copying them through the node's segment, with the same
    results bit for bit. Over any other group it is torch's DDP unchanged.

    torch 1.13's Reducer allocates its buckets itself, at construction and once more
    when it rebuilds them in the order gradients arrived (at the second forward). Both
    run here with chorus's allocator serving this thread's allocations of at least
    shared_allocation_min_bytes from node-shared memory (_C.SharedAllocations); every
    rank makes the same calls with the same shapes, so their buffers are of the same
    kind, as the direct path requires. Under torch's Join, the rebuild happens where
    torch does it, in ordinary memory (on every rank alike), and a joined rank's zero
    buckets are of the kind the others' buckets are."""

    def __init__(self, module, *args, **kwargs):
        bound = inspect.signature(_TorchDDP.__init__).bind(self, module, *args, **kwargs)
        group = bound.arguments.get("process_group")
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        shared = _shared_buckets_possible(group)
        with _Scope(shared):
            super().__init__(module, *args, **kwargs)
        self._chorus_shared_buckets = shared

    @property
    def buckets_in_shared_memory(self):
        """Whether the buckets are node-shared memory now."""
        return self._chorus_shared_buckets

    def forward(self, *inputs, **kwargs):
        if self._chorus_shared_buckets and torch.is_grad_enabled() and not self._join_config.enable:
            # The rebuild torch's forward would make (a collective, and nothing else
            # it does before it communicates), made first, under the allocator.
            with _Scope(True):
                if self.reducer._rebuild_buckets():
                    self._has_rebuilt_buckets = True
        rebuilt = self._has_rebuilt_buckets
        out = super().forward(*inputs, **kwargs)
        if self._has_rebuilt_buckets and not rebuilt:
            self._chorus_shared_buckets = False  # torch rebuilt them (under Join)
        return out

    def join_hook(self, **kwargs):
        hook = super().join_hook(**kwargs)
        torch_main_hook = hook.main_hook

        def main_hook():
            # torch's main hook rebuilds first, in ordinary memory, as the training
            # ranks do under Join: note it.
            if self.reducer._rebuild_buckets():
                self._chorus_shared_buckets = False
            torch_main_hook()

        hook.main_hook = main_hook
        return hook

    def _match_all_reduce_for_bwd_pass(self):
        # A joined rank's zero buckets, allreduced in bucket order against the training
        # ranks' buckets, must be the same kind of memory.
        if not self._chorus_shared_buckets:
            return super()._match_all_reduce_for_bwd_pass()
        with _Scope(True):
            zeros = self.reducer._get_zeros_like_grad_buckets()
        works = [self.reducer._run_comm_hook(bucket) for bucket in zeros]
        for work in works:
            work.wait()

    def __setstate__(self, state):
        shared = _shared_buckets_possible(dist.distributed_c10d._get_default_group())
        with _Scope(shared):
            super().__setstate__(state)
        self._chorus_shared_buckets = shared
