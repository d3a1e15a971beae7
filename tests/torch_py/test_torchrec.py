"""TorchRec's DLRM (examples/recsys/torchrec_dlrm.py) on chorus: its losses against gloo's
(compare_losses.py), and ranks killed or stopped under it. Opt-in, as TorchRec is in
none of the project's environments: the tests run where examples/recsys/setup_torchrec.sh
has installed it and its environment is given,

    eval "$(examples/recsys/setup_torchrec.sh)"   # CHORUS_TORCHREC_PYTHON, PYTHONPATH, LD_PRELOAD
    ctest --test-dir build-torch2 -L torchrec

and otherwise exit 77 (ctest: skipped) saying why. Run as a script:
    test_torchrec.py CLASS [unittest arguments]
"""
import os
import subprocess
import sys
import tempfile
import unittest

import ranks
import victims

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
ROOT = os.path.abspath(os.path.join(ranks.HERE, "..", ".."))
RECSYS = os.path.join(ROOT, "examples", "recsys")
SCRIPT = os.path.join(RECSYS, "torchrec_dlrm.py")
PYTHON = os.environ.get("CHORUS_TORCHREC_PYTHON", "")


def torchrec_site():
    """The folder TorchRec is installed in: on PYTHONPATH (as setup_torchrec.sh sets it),
    else the checkout's .torchrec/site; None where neither has it."""
    places = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    places.append(os.path.join(ROOT, ".torchrec", "site"))
    for place in places:
        if place and os.path.isfile(os.path.join(place, "torchrec", "__init__.py")):
            return place
    return None


def why_not():
    """Why these tests cannot run here, or None."""
    if not PYTHON:
        return ("CHORUS_TORCHREC_PYTHON is not set: TorchRec's tests are opt-in; "
                'eval "$(examples/recsys/setup_torchrec.sh)" first')
    if torchrec_site() is None:
        return ("TorchRec is not installed (no torchrec on PYTHONPATH nor in %s): "
                "examples/recsys/setup_torchrec.sh installs it" % os.path.join(ROOT, ".torchrec"))
    return None


def env():
    """The ranks' environment: the built torch_chorus, then TorchRec's folder (LD_PRELOAD,
    where setup_torchrec.sh set it, is inherited)."""
    path = [os.environ.get("CHORUS_PYTHONPATH", ""), torchrec_site()]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


SMALL = ["--steps", "10", "--rows", "2000"]


def run_job(test, n, backend, sharding, out_dir):
    """Runs the job; returns the path of rank 0's output (the loss lines)."""
    rs = ranks.finish(ranks.start(SCRIPT, n, ["--backend", backend, "--sharding", sharding, *SMALL],
                                  env=env(), python=PYTHON), 600)
    test.assertTrue(all(r.rc == 0 for r in rs), ranks.report(rs))
    path = os.path.join(out_dir, "%s_%s_%d.txt" % (backend, sharding, n))
    with open(path, "w") as f:
        f.write(rs[0].out)
    return path


def compare(test, a, b):
    """compare_losses.py's verdict: {"value": (max_abs, bitwise_equal), "global": ...}."""
    proc = subprocess.run([sys.executable, os.path.join(RECSYS, "compare_losses.py"), a, b],
                          capture_output=True, text=True, timeout=60)
    test.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
    print("%s against %s:\n%s" % (os.path.basename(a), os.path.basename(b), proc.stdout),
          file=sys.stderr, end="")
    verdict = {}
    for line in proc.stdout.splitlines():
        what, rest = line.split(":", 1)
        fields = dict(w.split("=") for w in rest.split())
        test.assertEqual(fields["steps"], SMALL[1], line)
        verdict[what] = (float(fields["max_abs"]), fields["bitwise_equal"] == "True")
    test.assertEqual(sorted(verdict), ["global", "value"], proc.stdout)
    return verdict


class TorchRecAgainstGloo(unittest.TestCase):
    """The same losses on chorus as on gloo, table-wise and row-wise: bit for bit at two
    ranks; at four within one float32 rounding of a loss of 0.69 (1.2e-7,
    examples/recsys/README.md: DDP's allreduce adds in another order)."""

    def losses(self, n, sharding):
        out = tempfile.mkdtemp(prefix="torchrec_")
        return compare(self, run_job(self, n, "chorus", sharding, out),
                       run_job(self, n, "gloo", sharding, out))

    def test_two_ranks_bit_for_bit(self):
        for sharding in ("table_wise", "row_wise"):
            with self.subTest(sharding=sharding):
                verdict = self.losses(2, sharding)
                self.assertTrue(verdict["value"][1] and verdict["global"][1], verdict)

    def test_four_ranks_within_rounding(self):
        for sharding in ("table_wise", "row_wise"):
            with self.subTest(sharding=sharding):
                verdict = self.losses(4, sharding)
                for what, (max_abs, _) in verdict.items():
                    self.assertLessEqual(max_abs, 1.2e-7, (what, verdict))


class TorchRecFailures(unittest.TestCase):
    """torchrec_dlrm.py (table-wise) on chorus with one rank killed or stopped by its
    --fail at step 2, before TorchRec's input all_to_all or DDP's allreduce: every other
    rank fails step 2 naming the operation and the victim's rank and host (victims.py)."""

    def survivors_lines(self, n, victim, phase, signal, timeout_s):
        return victims.survivors_lines(self, SCRIPT, ["--sharding", "table_wise", *SMALL], n,
                                       victim, phase, signal, timeout_s, env=env(),
                                       python=PYTHON)

    def test_killed_rank(self):
        for n, victim, phase in ((2, 1, "all_to_all"), (2, 1, "allreduce"),
                                 (3, 1, "all_to_all"), (3, 2, "allreduce")):
            with self.subTest(world_size=n, victim=victim, phase=phase):
                for line in self.survivors_lines(n, victim, phase, "kill", 60):
                    self.assertNotIn("timed out", line)

    def test_stopped_rank_times_out(self):
        for n, victim, phase in ((2, 1, "all_to_all"), (3, 1, "allreduce")):
            with self.subTest(world_size=n, victim=victim, phase=phase):
                for line in self.survivors_lines(n, victim, phase, "stop", 5):
                    self.assertIn("timed out", line)


if __name__ == "__main__":
    reason = why_not()
    if reason:
        print("SKIPPED: " + reason, flush=True)
        sys.exit(SKIP)
    unittest.main(module=__name__, argv=[sys.argv[0], "-v", *sys.argv[1:]])
