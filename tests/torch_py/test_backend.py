"""The chorus backend of torch.distributed, from Python (ctest label torch_py).

Each test starts the ranks as processes over env:// on 127.0.0.1 (ranks.py), with
PYTHONPATH naming the built torch_chorus package (the CHORUS_PYTHONPATH variable)."""
import os
import subprocess
import tempfile
import unittest

import ranks
import victims

ENV = {"PYTHONPATH": os.environ.get("CHORUS_PYTHONPATH", "")}


def ok(test, rs, word):
    test.assertTrue(all(r.rc == 0 for r in rs), ranks.report(rs))
    for r in rs:
        test.assertIn(word, r.out, ranks.report([r]))


class Collectives(unittest.TestCase):
    """Every collective on a chorus group against the same call on a gloo group."""

    def test_world_sizes_1_to_4(self):
        for n in (1, 2, 3, 4):
            with self.subTest(world_size=n):
                ok(self, ranks.run("collectives_worker.py", n, env=ENV), "checks ")

    def test_two_simulated_nodes_of_two(self):
        ok(self, ranks.run("collectives_worker.py", 4, env=ENV, nodes=2), "checks ")

    def test_odd_world_on_three_nodes(self):
        ok(self, ranks.run("collectives_worker.py", 3, env=dict(ENV, CHORUS_PY_COUNTS="0,1,1001"),
                           nodes=3), "checks ")


class InitMethods(unittest.TestCase):
    """tcp:// and file:// reach chorus as env:// does (a TCPStore, a FileStore)."""

    def test_tcp(self):
        url = "tcp://127.0.0.1:%d" % ranks.free_port()
        ok(self, ranks.run("init_worker.py", 3, [url], env=ENV), "init ok")

    def test_tcp_with_a_late_rank(self):
        # The others wait for rank 2's address in many short store waits: a torch
        # TCPStore wait that timed out used to leave its late reply on the socket and
        # break the next request ("Socket Timeout", or a wait without end).
        url = "tcp://127.0.0.1:%d" % ranks.free_port()
        rs = ranks.finish(ranks.start("init_worker.py", 3, [url], env=ENV,
                                      rank_env=lambda r: {"CHORUS_PY_INIT_DELAY": "3" if r == 2 else "0"}),
                          120)
        ok(self, rs, "init ok")

    def test_file(self):
        path = os.path.join(tempfile.mkdtemp(), "store")
        ok(self, ranks.run("init_worker.py", 3, ["file://" + path], env=ENV), "init ok")


class JobToken(unittest.TestCase):
    """chorus's data connections prove CHORUS_JOB_TOKEN from Python as from C++."""

    def test_same_token_joins(self):
        rs = ranks.run("token_worker.py", 2, env=dict(ENV, CHORUS_JOB_TOKEN="t0k3n"))
        ok(self, rs, "joined")

    def test_different_tokens_refuse_each_other(self):
        rs = ranks.finish(ranks.start("token_worker.py", 2, env=ENV,
                                      rank_env=lambda r: {"CHORUS_JOB_TOKEN": "token-%d" % r}),
                          120)
        for r in rs:
            self.assertEqual(r.rc, 3, ranks.report(rs))
        self.assertTrue(any("CHORUS_JOB_TOKEN" in r.out for r in rs), ranks.report(rs))


class DDPAgainstGloo(unittest.TestCase):
    """DDP over chorus trains like DDP over gloo: bit for bit with two ranks."""

    def test_two_ranks_bit_for_bit(self):
        ok(self, ranks.run("ddp_worker.py", 2, env=ENV), "steps ")

    def test_two_simulated_nodes_of_two(self):
        ok(self, ranks.run("ddp_worker.py", 4, env=ENV, nodes=2), "steps ")

    def test_three_ranks(self):
        ok(self, ranks.run("ddp_worker.py", 3, env=ENV), "steps ")


class SparseAgainstGloo(unittest.TestCase):
    """all_reduce of sparse COO tensors (DDP's sparse embedding gradients) on chorus
    against gloo (sparse_worker.py): gloo's results bit for bit, gloo's refusals, an
    error on every rank for tensors that disagree, DDP trained like DDP over gloo."""

    # Four ranks: on two simulated nodes of two, below (each world size is a job of its
    # own; shared memory's allgatherv at four ranks is the comm suite's).
    def test_results_world_sizes_1_to_3(self):
        for n in (1, 2, 3):
            with self.subTest(world_size=n):
                ok(self, ranks.run("sparse_worker.py", n, ["results"], env=ENV), "checks ")

    def test_results_two_simulated_nodes_of_two(self):
        ok(self, ranks.run("sparse_worker.py", 4, ["results"], env=ENV, nodes=2), "checks ")

    def test_disagreeing_ranks_fail_on_every_rank(self):
        for n in (2, 3):
            with self.subTest(world_size=n):
                ok(self, ranks.run("sparse_worker.py", n, ["mismatch"], env=ENV), "checks ")

    def test_ddp_sparse_embeddings(self):
        # Two ranks: bit for bit. Four: the dense Linear's gradients are summed in another
        # order than gloo's (the sparse ones in gloo's).
        for n in (2, 4):
            with self.subTest(world_size=n):
                ok(self, ranks.run("sparse_worker.py", n, ["ddp"], env=ENV), "checks ")



class DLRMShardedAgainstGloo(unittest.TestCase):
    """examples/recsys/dlrm_sharded.py (table-wise embeddings, the butterfly
    all_to_all_single with split sizes and its reverse in backward, DDP MLPs) trains on
    chorus as on gloo: the same loss lines bit for bit at two ranks, within rounding at
    three (tables and batch that do not divide evenly)."""

    SCRIPT = os.path.join(ranks.HERE, "..", "..", "examples", "recsys", "dlrm_sharded.py")
    SMALL = ["--steps", "4", "--tables", "4", "--rows", "1000", "--dim", "16",
             "--bot-mlp", "32", "--top-mlp", "32"]

    def losses(self, n, backend, args):
        rs = ranks.run(self.SCRIPT, n, ["--backend", backend, *self.SMALL, *args], env=ENV)
        ok(self, rs, "")
        lines = [l for l in rs[0].out.splitlines() if l.startswith("loss step=")]
        self.assertEqual(len(lines), 4, ranks.report(rs))
        self.assertIn("checksum value=", rs[0].out, ranks.report(rs))
        return lines

    def test_two_ranks_bit_for_bit(self):
        for args in (["--batch-size", "256"], ["--batch-size", "255", "--sparse"],
                     ["--batch-size", "255", "--tables", "5"]):
            with self.subTest(args=" ".join(args)):
                self.assertEqual(self.losses(2, "chorus", args), self.losses(2, "gloo", args))

    def test_three_ranks_uneven_tables_and_batch(self):
        args = ["--batch-size", "100"]  # 4 tables on 3 ranks, slices of 34, 33, 33
        chorus, gloo = self.losses(3, "chorus", args), self.losses(3, "gloo", args)
        for a, b in zip(chorus, gloo):
            fa = [float(w.split("=")[1]) for w in a.split()[2:]]
            fb = [float(w.split("=")[1]) for w in b.split()[2:]]
            for x, y in zip(fa, fb):
                self.assertAlmostEqual(x, y, delta=1e-5 * abs(y), msg="%s\n%s" % (a, b))

    def test_profile_changes_nothing_and_its_phases_add_up(self):
        # --profile (step_profile.py): the same losses, and per rank and step the
        # phases sum to the step, with both all_to_alls, DDP's wait and the loss
        # all_reduce among them, on one node and on two simulated nodes.
        import json
        for backend, nodes in (("chorus", 1), ("chorus", 2), ("gloo", 1)):
            with self.subTest(backend=backend, nodes=nodes):
                d = tempfile.mkdtemp()
                args = ["--backend", backend, *self.SMALL, "--batch-size", "64"]
                rs = ranks.run(self.SCRIPT, 2, [*args, "--profile", d], env=ENV, nodes=nodes)
                ok(self, rs, "")
                plain = ranks.run(self.SCRIPT, 2, args, env=ENV, nodes=nodes)
                ok(self, plain, "")
                losses = [[l for l in r.out.splitlines() if l.startswith("loss ")]
                          for r in (rs[0], plain[0])]
                self.assertEqual(losses[0], losses[1])
                for rank in (0, 1):
                    with open(os.path.join(d, "rank%d.json" % rank)) as f:
                        prof = json.load(f)
                    self.assertEqual((prof["rank"], prof["world"]), (rank, 2))
                    self.assertEqual([s["step"] for s in prof["steps"]], [0, 1, 2, 3])
                    for step in prof["steps"]:
                        ph = step["phases"]
                        for name in ("input", "lookup_fwd", "a2a_fwd", "mlp_fwd", "mlp_bwd",
                                     "a2a_bwd", "lookup_bwd", "ddp_wait", "optimizer",
                                     "loss_allreduce"):
                            self.assertIn(name, ph)
                            self.assertGreaterEqual(ph[name], 0.0)
                        self.assertAlmostEqual(sum(ph.values()), step["end"] - step["start"],
                                               delta=1e-6)
                        self.assertEqual([c["name"] for c in step["collectives"]],
                                         ["a2a_fwd", "a2a_bwd", "loss_allreduce"])
                        for c in step["collectives"]:
                            self.assertLessEqual(c["issue"], c["wait"])
                            self.assertLessEqual(c["wait"], c["leave"])


class DLRMShardedFailures(unittest.TestCase):
    """dlrm_sharded.py on chorus with one rank killed (SIGKILL) or stopped (SIGSTOP) by
    its own --fail at step 2, just before the butterfly all_to_all or before DDP's
    allreduce: every other rank fails step 2 with one line (examples/recsys/faults.py)
    naming the operation and the victim's rank and host, a killed rank found dead, a
    stopped one at the job's timeout. Nothing hangs: a survivor still running at the
    test's deadline (the job's timeout and 120 s) fails the test."""

    SCRIPT = DLRMShardedAgainstGloo.SCRIPT
    ARGS = DLRMShardedAgainstGloo.SMALL + ["--batch-size", "64", "--steps", "5"]

    def survivors_lines(self, n, victim, phase, signal, timeout_s, nodes=1):
        return victims.survivors_lines(self, self.SCRIPT, self.ARGS, n, victim, phase, signal,
                                       timeout_s, nodes, env=ENV)

    # Each phase is met at 2 and 3 ranks, by a first, middle and last victim, on one node
    # and on three, killed and stopped; not every combination (each case is a job of its
    # own: the ten combinations took 171 s of CI's torch 2.15 run).
    def test_killed_rank(self):
        for n, victim, phase, nodes in ((2, 1, "all_to_all", 1), (3, 1, "allreduce", 1),
                                        (3, 0, "all_to_all", 1), (3, 2, "allreduce", 3)):
            with self.subTest(world_size=n, victim=victim, phase=phase, nodes=nodes):
                for line in self.survivors_lines(n, victim, phase, "kill", 60, nodes):
                    # Found dead, not by the job's 60 s timeout running out.
                    self.assertNotIn("timed out", line)

    def test_stopped_rank_times_out(self):
        for n, victim, phase in ((2, 1, "allreduce"), (3, 1, "all_to_all")):
            with self.subTest(world_size=n, victim=victim, phase=phase):
                for line in self.survivors_lines(n, victim, phase, "stop", 5):
                    self.assertIn("timed out", line)


class SharedBuckets(unittest.TestCase):
    """torch_chorus.DistributedDataParallel keeps its buckets in node-shared memory
    where the direct path is possible, and trains bit for bit like torch's DDP with
    ordinary buckets (shared_ddp_worker.py)."""

    def test_one_node_world_sizes_2_to_4(self):
        for n in (2, 3, 4):
            with self.subTest(world_size=n):
                ok(self, ranks.run("shared_ddp_worker.py", n, ["shared"], env=ENV), "steps ")

    def test_ordinary_where_the_direct_path_is_not(self):
        for what, n, env, nodes in (("CHORUS_SHM_DIRECT=0", 2, {"CHORUS_SHM_DIRECT": "0"}, 1),
                                    ("tcp", 2, {"CHORUS_TRANSPORT": "tcp"}, 1),
                                    ("one rank per node", 2, {}, 2),
                                    ("two nodes of two", 4, {}, 2)):
            with self.subTest(what):
                ok(self, ranks.run("shared_ddp_worker.py", n, ["ordinary"], env=dict(ENV, **env),
                                   nodes=nodes), "steps ")


class Failures(unittest.TestCase):
    """A rank that dies or stops mid-training: every other rank raises, naming the
    operation, the rank and the host, and its group stays broken."""

    def run_victim(self, mode, n, nodes, timeout_s, env=None):
        d = tempfile.mkdtemp()
        rs = ranks.start("failure_worker.py", n, [mode, str(n - 1), str(timeout_s)],
                         env={**ENV, "CHORUS_PY_DIR": d, **(env or {})}, nodes=nodes)
        survivors = ranks.finish(rs[:-1], 120)
        rs[-1].proc.kill()
        ranks.finish(rs[-1:], 30)
        for r in survivors:
            self.assertEqual(r.rc, 3, ranks.report(rs))
            line = next(l for l in r.out.splitlines() if l.startswith("raised after"))
            seconds = float(line.split()[2])
            self.assertIn("allreduce", line)
            self.assertIn("rank", line)
            self.assertIn("host", line)
            self.assertIn("aborted and cannot be used", r.out)
            yield r, seconds, line

    def test_killed_rank(self):
        for n, nodes in ((3, 1), (4, 2)):
            with self.subTest(world_size=n, nodes=nodes):
                for r, seconds, line in self.run_victim("kill", n, nodes, 60):
                    # A dead peer is found dead (its connection or segment gone), not
                    # by the group's 60 s timeout running out; tests assert no times.
                    # (Seen: 0.03-0.08 s after the kill on an idle machine.)
                    self.assertNotIn("timed out", line)
                    self.assertIn("rank %d " % (n - 1), line)

    def test_stopped_rank_times_out(self):
        for r, seconds, line in self.run_victim("stop", 3, 1, 3):
            self.assertTrue("timed out" in line or "aborted" in line, line)

    def test_stopped_rank_times_out_at_chorus_timeout(self):
        # CHORUS_TIMEOUT wins over init_process_group's 600 s, which would outlast the
        # survivors' 120 s in run_victim.
        for r, seconds, line in self.run_victim("stop", 3, 1, 600, env={"CHORUS_TIMEOUT": "3"}):
            self.assertTrue("timed out" in line or "aborted" in line, line)
            self.assertIn("CHORUS_TIMEOUT=3 (3000 ms) applies", r.err)


class PendingCallbacks(unittest.TestCase):
    """A Python callback on a chorus future still to run when the program exits or
    destroys its group (exit_worker.py): the exit keeps its status (it was SIGABRT: the
    thread completing the future asked for the GIL after Python had begun to finalize),
    and destroy_process_group returns once the callback has run (it waited for good:
    the group was dropped with the GIL held, the callback waited for it)."""

    def test_exit(self):
        rs = ranks.run("exit_worker.py", 2, ["exit"], env=ENV, timeout=120)
        self.assertEqual([r.rc for r in rs], [0, 0], ranks.report(rs))
        self.assertIn("rank 1 done", rs[1].out, ranks.report(rs))

    def test_destroy(self):
        rs = ranks.run("exit_worker.py", 2, ["destroy"], env=ENV, timeout=120)
        ok(self, rs, "")
        self.assertIn("destroyed; the callback gave 8.0", rs[0].out, ranks.report(rs))


class Timeouts(unittest.TestCase):
    """init_process_group's timeout is the group's unless CHORUS_TIMEOUT (else
    HCCL_EXEC_TIMEOUT) is set: the operator's override then applies, and each rank says
    so in one warning line. timeout_worker.py checks which timeout the group accepts
    for a per-call timeout and setTimeout (the one that applies, only)."""

    # Neither variable, and warnings logged, whatever the caller's environment holds.
    CLEAN = {"CHORUS_TIMEOUT": None, "HCCL_EXEC_TIMEOUT": None, "CHORUS_LOG_LEVEL": None,
             "CHORUS_DEBUG": None}

    def run_worker(self, asked, applies, **env):
        rs = ranks.run("timeout_worker.py", 2, [str(asked), str(applies)],
                       env={**ENV, **self.CLEAN, **env})
        ok(self, rs, "timeout ok")
        return rs

    def test_init_process_groups_timeout_applies_without_the_variables(self):
        for r in self.run_worker(20, 20):
            self.assertNotIn("applies to every operation", r.err, ranks.report([r]))

    def test_chorus_timeout_wins_and_says_so_once(self):
        for r in self.run_worker(20, 45, CHORUS_TIMEOUT="45"):
            self.assertEqual(r.err.count("CHORUS_TIMEOUT=45 (45000 ms) applies to every operation, "
                                         "not the timeout the program asked for (20000 ms)"), 1,
                             ranks.report([r]))

    def test_hccl_exec_timeout_is_the_fallback(self):
        for r in self.run_worker(20, 7, HCCL_EXEC_TIMEOUT="7"):
            self.assertIn("HCCL_EXEC_TIMEOUT=7 (7000 ms) applies", r.err, ranks.report([r]))


class Seeds(unittest.TestCase):
    """The seeds' own scripts under chorusrun (examples/seeds/run.sh), a few batches an
    epoch: seed 000's first losses are gloo's, and every rank ends with the same
    parameters."""

    ROOT = os.path.abspath(os.path.join(ranks.HERE, "..", ".."))

    def run_seed(self, *args):
        env = dict(os.environ, CHORUS_SEED_WORKDIR=tempfile.mkdtemp(), CHORUS_SEED_PYTHON=ranks.PYTHON)
        if os.environ.get("CHORUS_PYTHONPATH"):
            env["CHORUS_SEED_BUILD"] = os.path.dirname(os.environ["CHORUS_PYTHONPATH"])
        proc = subprocess.run([os.path.join(self.ROOT, "examples", "seeds", "run.sh"), *args],
                              env=env, capture_output=True, text=True, timeout=900)
        # The causes first: a C++ exception's backtrace would fill the tail.
        causes = [l for l in (proc.stdout + proc.stderr).splitlines()
                  if "frame #" not in l and ("rror" in l or "failed" in l or "what()" in l)]
        self.assertEqual(proc.returncode, 0, "\n".join(causes[:40]) + "\n" +
                         proc.stdout[-3000:] + proc.stderr[-3000:])
        hashes = [l.split()[-1] for l in proc.stdout.splitlines() if "param-hash" in l]
        return proc.stdout, hashes

    def test_seed000_two_ranks(self):
        out, hashes = self.run_seed("--steps", "2")
        self.assertIn("[rank 0]: loss: 2.309577 [    0/60000]", out)
        self.assertIn("[rank 1]: loss: 2.303763 [    0/60000]", out)
        self.assertEqual(len(hashes), 2, out)
        self.assertEqual(len(set(hashes)), 1, out)

    def test_seed001_two_nodes_of_two(self):
        out, hashes = self.run_seed("--seed", "001", "--nodes", "2", "--steps", "3")
        self.assertIn("Epoch: 9 | Batch: 0 | Loss:", out)
        self.assertEqual(len(hashes), 4, out)
        self.assertEqual(len(set(hashes)), 1, out)


if __name__ == "__main__":
    unittest.main()
