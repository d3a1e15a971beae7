"""One rank of the torch 2 suite (test_torch2.py): FSDP2, DTensor, functional
collectives and distributed checkpoints over the backend named on the command line
(the test runs each mode on gloo, then on chorus, and the chorus run compares itself
with gloo's results, which rank 0 wrote to OUTDIR).

    fsdp2_worker.py MODE BACKEND OUTDIR [PHASE]

MODE: fsdp2 | dtensor | funcol | dcp (PHASE save or load) | kill.
Each rank prints "max-diff WHAT VALUE" lines and, at the end, "done MODE"."""
import copy
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing import assert_close

import torch_chorus  # noqa: F401

mode, backend, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
phase = sys.argv[4] if len(sys.argv) > 4 else ""
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
TOL = dict(rtol=1e-5, atol=1e-6)  # FSDP against one process: rounding of the sums
GLOBAL_BATCH = 32                 # the whole batch of a step, split among the ranks


def say(*args):
    print(*args, flush=True)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(step):
    """The whole batch of a step (the same on every rank), and this rank's part."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(GLOBAL_BATCH, 16, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
    per = GLOBAL_BATCH // world
    return (x, y), (x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])


def shard(model, mesh, **kw):
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_params(model):
    return {k: full(p).detach().clone() for k, p in model.named_parameters()}


def max_diff(a, b):
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def against_gloo(name, params, **tol):
    """gloo's run saves its final parameters; chorus's run compares with them."""
    path = os.path.join(outdir, "%s-gloo.pt" % name)
    if backend == "gloo":
        if rank == 0:
            torch.save(params, path)
        return
    ref = torch.load(path)
    d = max_diff(params, ref)
    say("max-diff %s-vs-gloo %.3g" % (name, d))
    for k in params:
        assert_close(params[k], ref[k], msg=lambda m: "%s %s vs gloo: %s" % (name, k, m), **tol)


def train_against_reference(name, model, steps, opt_cls=torch.optim.SGD, ref_tol=TOL,
                            check_grads=True, **opt_kw):
    """Trains the sharded `model` and a one-process copy of make_model() on the whole
    batch side by side; after every step they must agree, and the gradient must be the
    average over the ranks (not their sum)."""
    ref = make_model()
    ropt = opt_cls(ref.parameters(), **opt_kw)
    opt = opt_cls(model.parameters(), **opt_kw)
    worst = 0.0
    for step in range(steps):
        (x, y), (xr, yr) = batch(step)
        nn.functional.mse_loss(model(xr), yr).backward()
        nn.functional.mse_loss(ref(x), y).backward()
        if check_grads:
            for (k, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
                g = full(p.grad)
                assert_close(g, rp.grad, **ref_tol,
                             msg=lambda m: "%s step %d grad %s vs the reference: %s" % (name, step, k, m))
                if world > 1 and rp.grad.abs().max() > 1e-4:
                    # a sum over the ranks would be world times the average
                    assert not torch.allclose(g, world * rp.grad, **ref_tol), \
                        "%s: grad %s is the sum, not the average" % (name, k)
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
        p, rp = full_params(model), {k: v.detach() for k, v in ref.named_parameters()}
        d = max_diff(p, rp)
        worst = max(worst, d)
        for k in p:
            assert_close(p[k].float(), rp[k], **ref_tol,
                         msg=lambda m: "%s step %d param %s vs the reference: %s" % (name, step, k, m))
    say("max-diff %s-vs-reference %.3g" % (name, worst))
    return full_params(model)


def mode_fsdp2():
    mesh = init_device_mesh("cpu", (world,))
    p = train_against_reference("fsdp2-sgd", shard(make_model(), mesh), 5, lr=0.05, momentum=0.9)
    against_gloo("fsdp2-sgd", p, **TOL)
    p = train_against_reference("fsdp2-adam", shard(make_model(), mesh), 5, torch.optim.Adam, lr=1e-3)
    against_gloo("fsdp2-adam", p, **TOL)
    # bf16 parameters in forward and backward, fp32 gradient reduction: against the
    # reference only loosely (bf16 rounding), against gloo's run closely.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    p = train_against_reference("fsdp2-mp", shard(make_model(), mesh, mp_policy=mp), 5,
                                ref_tol=dict(rtol=5e-2, atol=2e-2), check_grads=False, lr=0.05)
    against_gloo("fsdp2-mp", p, rtol=1e-3, atol=1e-4)
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        p = train_against_reference("hsdp", shard(make_model(), mesh2), 5, lr=0.05, momentum=0.9)
        against_gloo("hsdp", p, **TOL)


def mode_dtensor():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(7)
    for shape in ((8, 6), (7, 5), (3,)):
        t = torch.randn(*shape)
        for first in (Shard(0), Replicate()) + ((Shard(1),) if len(shape) > 1 else ()):
            d = distribute_tensor(t, mesh, [first])
            assert_close(d.full_tensor(), t, rtol=0, atol=0)
            for to in (Replicate(), Shard(0)):
                r = d.redistribute(mesh, [to])
                assert_close(r.full_tensor(), t, rtol=0, atol=0)
                assert_close(r.redistribute(mesh, [first]).full_tensor(), t, rtol=0, atol=0)
        # an op on sharded tensors: (t @ t.T) through DTensor equals the local result
        if len(shape) == 2:
            a = distribute_tensor(t, mesh, [Shard(0)])
            assert_close((a @ a.T).full_tensor(), t @ t.T, rtol=1e-5, atol=1e-6)
            assert_close(a.sum().full_tensor(), t.sum(), rtol=1e-5, atol=1e-6)
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        t = torch.randn(8, 8)
        d = distribute_tensor(t, mesh2, [Shard(0), Shard(1)])
        assert_close(d.redistribute(mesh2, [Replicate(), Shard(0)]).full_tensor(), t, rtol=0, atol=0)
    say("dtensor checks passed")


def mode_funcol():
    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    t = torch.arange(6, dtype=torch.float32) + 10 * rank
    s = funcol.wait_tensor(funcol.all_reduce(t, "sum", group))
    expected = sum(torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world))
    assert_close(s, expected, rtol=0, atol=0)
    g = funcol.wait_tensor(funcol.all_gather_tensor(t, 0, group))
    assert_close(g, torch.cat([torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)]),
                 rtol=0, atol=0)
    big = torch.arange(4 * world, dtype=torch.float32) * (rank + 1)
    rs = funcol.wait_tensor(funcol.reduce_scatter_tensor(big, "sum", 0, group))
    total = torch.arange(4 * world, dtype=torch.float32) * sum(r + 1 for r in range(world))
    assert_close(rs, total[rank * 4:(rank + 1) * 4], rtol=0, atol=0)
    say("funcol checks passed")

    def f(x):
        y = funcol.all_reduce(x * 2, "sum", group)
        return funcol.wait_tensor(y) + 1

    try:
        cf = torch.compile(f)
        out = cf(t)
    except Exception as e:  # no C++ toolchain for inductor, ...
        say("compile-skipped: %s" % str(e).replace("\n", " ")[:300])
    else:
        assert_close(out, 2 * expected + 1, rtol=0, atol=0)
        say("compiled all_reduce passed")


def mode_dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    ckpt = os.path.join(outdir, "ckpt-%s" % backend)
    mesh = init_device_mesh("cpu", (world,))
    model = shard(make_model(), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    steps = range(0, 3) if phase == "save" else range(3, 6)
    if phase == "load":
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for step in steps:
        _, (xr, yr) = batch(step)
        nn.functional.mse_loss(model(xr), yr).backward()
        opt.step()
        opt.zero_grad()
    if phase == "save":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        say("saved %s" % ckpt)
    else:
        # a run that never stopped: one process, 6 steps on the whole batches
        ref = make_model()
        ropt = torch.optim.Adam(ref.parameters(), lr=1e-2)
        for step in range(6):
            (x, y), _ = batch(step)
            nn.functional.mse_loss(ref(x), y).backward()
            ropt.step()
            ropt.zero_grad()
        p, rp = full_params(model), {k: v.detach() for k, v in ref.named_parameters()}
        say("max-diff dcp-resumed-vs-uninterrupted %.3g" % max_diff(p, rp))
        for k in p:
            assert_close(p[k], rp[k], **TOL)
        against_gloo("dcp", p, **TOL)


def mode_kill():
    victim = world - 1
    mesh = init_device_mesh("cpu", (world,))
    model = shard(make_model(), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(100000):
            if step == 5 and rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            _, (xr, yr) = batch(step % 10)
            nn.functional.mse_loss(model(xr), yr).backward()
            opt.step()
            opt.zero_grad()
    except RuntimeError as e:
        say("raised %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:600]))
        os._exit(3)
    say("never raised")
    os._exit(5)


{"fsdp2": mode_fsdp2, "dtensor": mode_dtensor, "funcol": mode_funcol, "dcp": mode_dcp,
 "kill": mode_kill}[mode]()
dist.barrier()
say("done %s" % mode)
dist.destroy_process_group()
