"""The chorus backend under torch 2's distributed stack (ctest label torch_py): FSDP2
(fully_shard, mixed precision, HSDP), DTensor, functional collectives (eager and
compiled), distributed checkpoints and a rank killed under FSDP2 (fsdp2_worker.py).

Every mode runs on gloo, then on chorus; the chorus run compares its parameters with
gloo's (and both with a one-process reference). The ranks' interpreter
(CHORUS_TEST_PYTHON, ranks.PYTHON) needs torch >= 2; with an older torch (Debian's
1.13) every class is skipped."""
import os
import subprocess
import tempfile
import unittest

import ranks

ENV = {"PYTHONPATH": os.environ.get("CHORUS_PYTHONPATH", "")}
BACKENDS = ("gloo", "chorus")


def torch_major():
    """The major version of the ranks' torch; 0 where it cannot be imported."""
    try:
        out = subprocess.run([ranks.PYTHON, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120).stdout
        return int(out.strip().split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


TORCH_MAJOR = torch_major()
NEEDS_TORCH2 = unittest.skipIf(TORCH_MAJOR < 2, "the ranks' torch is older than 2 (FSDP2, "
                               "DTensor and functional collectives need torch 2)")


def ok(test, rs, word):
    test.assertTrue(all(r.rc == 0 for r in rs), ranks.report(rs))
    for r in rs:
        test.assertIn(word, r.out, ranks.report([r]))


def diffs(rs):
    """The worker's "max-diff WHAT VALUE" lines of rank 0, as {WHAT: VALUE}."""
    return {l.split()[1]: float(l.split()[2]) for l in rs[0].out.splitlines()
            if l.startswith("max-diff ")}


def run_both(test, mode, n, *args, timeout=150):
    """Runs `mode` on gloo, then on chorus (which compares itself with gloo's files in
    the same directory); returns chorus's ranks."""
    d = tempfile.mkdtemp()
    for backend in BACKENDS:
        with test.subTest(backend=backend, world_size=n):
            rs = ranks.run("fsdp2_worker.py", n, [mode, backend, d, *args], env=ENV,
                           timeout=timeout)
            ok(test, rs, "done " + mode)
    return rs


@NEEDS_TORCH2
class FSDP2AgainstGloo(unittest.TestCase):
    """fully_shard over a 1-D mesh trains like one process on the whole batch (SGD with
    momentum, Adam), the gradients being averages, not sums; bf16 mixed precision
    matches gloo's run; HSDP on a 2x2 mesh (4 ranks) matches the reference too."""

    def check(self, n):
        rs = run_both(self, "fsdp2", n)
        d = diffs(rs)
        names = ["fsdp2-sgd", "fsdp2-adam", "fsdp2-mp"] + (["hsdp"] if n == 4 else [])
        for name in names:
            self.assertIn(name + "-vs-gloo", d, ranks.report(rs))
        return d

    def test_two_ranks(self):
        self.check(2)

    def test_four_ranks_with_hsdp(self):
        self.check(4)


@NEEDS_TORCH2
class DTensorOnChorus(unittest.TestCase):
    """distribute_tensor with Shard and Replicate, redistribute between them, and back:
    full_tensor() is the original."""

    def test_two_and_four_ranks(self):
        for n in (2, 4):
            run_both(self, "dtensor", n)


@NEEDS_TORCH2
class FunctionalCollectives(unittest.TestCase):
    """all_reduce, all_gather_tensor and reduce_scatter_tensor of
    torch.distributed._functional_collectives, with wait_tensor; and one torch.compile'd
    all_reduce where the compiler works (else the worker prints "compile-skipped")."""

    def test_two_ranks(self):
        rs = run_both(self, "funcol", 2, timeout=240)
        for r in rs:
            self.assertTrue("compiled all_reduce passed" in r.out or "compile-skipped" in r.out,
                            ranks.report([r]))


@NEEDS_TORCH2
class DistributedCheckpoint(unittest.TestCase):
    """An FSDP2 model and its Adam state saved by torch.distributed.checkpoint from 4
    ranks, loaded by 2 ranks that train on: the same parameters as a run that never
    stopped, and as gloo's."""

    def test_save_on_four_load_on_two(self):
        d = tempfile.mkdtemp()
        for backend in BACKENDS:
            for phase, n in (("save", 4), ("load", 2)):
                with self.subTest(backend=backend, phase=phase):
                    rs = ranks.run("fsdp2_worker.py", n, ["dcp", backend, d, phase], env=ENV,
                                   timeout=150)
                    ok(self, rs, "done dcp")
        self.assertIn("dcp-vs-gloo", diffs(rs), ranks.report(rs))


@NEEDS_TORCH2
class FSDP2Failures(unittest.TestCase):
    """The last rank kills itself mid-FSDP2-training: every other rank raises a
    RuntimeError naming the operation, the dead rank and the host."""

    def test_killed_rank(self):
        for n in (2, 4):
            with self.subTest(world_size=n):
                rs = ranks.start("fsdp2_worker.py", n, ["kill", "chorus", tempfile.mkdtemp()],
                                 env=ENV)
                survivors = ranks.finish(rs[:-1], 120)
                rs[-1].proc.kill()
                ranks.finish(rs[-1:], 30)
                for r in survivors:
                    self.assertEqual(r.rc, 3, ranks.report(rs))
                    line = next(l for l in r.out.splitlines() if l.startswith("raised "))
                    self.assertIn("failed", line)
                    self.assertIn("rank %d " % (n - 1), line)
                    self.assertIn("host", line)
                    self.assertNotIn("timed out", line)


if __name__ == "__main__":
    unittest.main()
