"""One rank of the DDP suite: the same model trained side by side with DDP over a gloo
group and over a chorus group, on the same data, in several DDP configurations.
With two ranks every parameter must be equal bit for bit after every step (a sum of
two numbers does not depend on the order); with more, gloo and chorus add in
different orders, so they must agree to CHORUS_PY_DDP_RTOL. Prints "steps N"."""
import copy
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_chorus  # noqa: F401

dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
GL = dist.new_group(backend="gloo")
CH = dist.new_group(backend="chorus")
RTOL = float(os.environ.get("CHORUS_PY_DDP_RTOL", "0" if n == 2 else "1e-5"))
steps = 0


class Seed000(nn.Module):  # seed 000's NeuralNetwork
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(nn.Linear(28 * 28, 512), nn.ReLU(),
                                               nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


class WithUnused(nn.Module):  # a branch that gets no gradient, and a BatchNorm buffer
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(784, 64)
        self.bn = nn.BatchNorm1d(64)
        self.b = nn.Linear(64, 10)
        self.unused = nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x.flatten(1)))))


def compare(m_gloo, m_chorus, what, rtol=RTOL, atol=1e-7):
    for (name, pg), (_, pc) in zip(m_gloo.named_parameters(), m_chorus.named_parameters()):
        if rtol == 0:
            ok = torch.equal(pg, pc)
        else:
            ok = torch.allclose(pg, pc, rtol=rtol, atol=atol)
        assert ok, "%s: rank %d parameter %s differs: max |diff| %g" % (
            what, rank, name, (pg - pc).abs().max().item())
    for (name, bg), (_, bc) in zip(m_gloo.named_buffers(), m_chorus.named_buffers()):
        assert torch.equal(bg, bc) if RTOL == 0 else torch.allclose(bg.float(), bc.float(), rtol=RTOL, atol=1e-6), \
            "%s: buffer %s differs" % (what, name)


def train(make, what, ddp_kwargs=None, hook=None, accumulate=1, iters=6, batch=64, half=False):
    global steps
    torch.manual_seed(0)
    base = make()
    models = {}
    for key, group in (("gloo", GL), ("chorus", CH)):
        ddp = DDP(copy.deepcopy(base), process_group=group, **(ddp_kwargs or {}))
        if hook is not None:
            state, fn = hook(group)
            ddp.register_comm_hook(state, fn)
        models[key] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9))
    g = torch.Generator().manual_seed(100 + rank)
    for it in range(iters):
        x = torch.rand(batch, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        for key in ("gloo", "chorus"):
            ddp, opt = models[key]
            last = (it + 1) % accumulate == 0
            if last:
                loss = nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
            else:
                with ddp.no_sync():
                    nn.functional.cross_entropy(ddp(x), y).backward()
            if last:
                opt.step()
                opt.zero_grad()
        # fp16 sums of more than two ranks in another order differ at fp16's precision.
        tol = (2e-3, 1e-5) if half and RTOL else (RTOL, 1e-7)
        compare(models["gloo"][0].module, models["chorus"][0].module, "%s step %d" % (what, it), *tol)
        steps += 1


train(Seed000, "seed model, defaults")
train(Seed000, "seed model, small buckets, gradient_as_bucket_view",
      {"bucket_cap_mb": 1, "gradient_as_bucket_view": True})
train(WithUnused, "find_unused_parameters with a BatchNorm buffer", {"find_unused_parameters": True})
train(Seed000, "no_sync over 3 steps", accumulate=3, iters=6)
train(Seed000, "allreduce_hook", hook=lambda g: (g, default_hooks.allreduce_hook))
train(Seed000, "fp16_compress_hook", hook=lambda g: (g, default_hooks.fp16_compress_hook), half=True)
# PowerSGD issues its second allreduce from the first one's callback: with several
# buckets, that races with the next bucket's allreduce, and ranks would issue them in
# different orders (gloo aborts on it). A model of one bucket (< 1 MiB) keeps one order.
train(lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 96), nn.ReLU(), nn.Linear(96, 10)),
      "PowerSGD, one bucket",
      hook=lambda g: (powerSGD_hook.PowerSGDState(process_group=g, matrix_approximation_rank=2,
                                                  start_powerSGD_iter=2, random_seed=0),
                      powerSGD_hook.powerSGD_hook), iters=5)
# (bf16_compress_hook: DDP 1.13 itself refuses it without CUDA 11 and NCCL 2.10.)
dist.barrier()
print("steps %d" % steps)
# The DDP models of train() hold their groups through reference cycles: collected now,
# every group (gloo's too) is destroyed here, while the interpreter is whole, rather
# than at its finalization, where a group's threads may still hold tensors (a rank 0
# once ended in "terminate called without an active exception" after its last step
# under torch 2.15; PyTorch reports the same of gloo groups left to the exit).
gc.collect()
dist.destroy_process_group()
