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
"""
import torch
import torch.distributed as dist

from . import _C

__all__ = ["ProcessGroupChorus", "register_as", "BACKEND"]

BACKEND = "chorus"
ProcessGroupChorus = _C.ProcessGroupChorus


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout)


def register_as(name):
    """Registers chorus under `name` as well (e.g. "hccl"); a name torch already has
    (gloo, nccl, mpi, ucc) or one registered before raises ValueError."""
    key = name.upper()
    if hasattr(dist.Backend, key) or key in getattr(dist.Backend, "_plugins", {}):
        raise ValueError(f"torch_chorus: the backend name {name!r} is taken")
    if _C.torch_version_major >= 2:
        dist.Backend.register_backend(name, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(name, _create)


if BACKEND.upper() not in getattr(dist.Backend, "_plugins", {}):
    register_as(BACKEND)
