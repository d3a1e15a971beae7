"""A recommendation job (examples/recsys) with one rank that kills or stops itself by its
--fail option (faults.py), and what its survivors said: used by the DLRM failure tests
of test_backend.py and test_torchrec.py."""
import sys

import ranks

# The chorus operation each --fail phase's survivors name: all_to_all_single is chorus's
# alltoall without split sizes (TorchRec's first of a step), alltoallv with them.
OPERATION = {"all_to_all": "alltoall", "allreduce": "allreduce #"}
STEP = 2  # the victim fails at this step; the others fail the same step


def survivors_lines(test, script, args, n, victim, phase, signal, timeout_s, nodes=1, env=None,
                    python=None):
    """Runs `script` on chorus with `--timeout timeout_s --fail victim:STEP:phase:signal`;
    checks that the victim said what it did and that every other rank exited 1 by the
    test's deadline (the job's timeout and 120 s) with one "rank R failed at step STEP"
    line naming the operation and the victim's rank and host. Returns those lines (and
    prints them on stderr)."""
    spec = "%d:%d:%s:%s" % (victim, STEP, phase, signal)
    rs = ranks.start(script, n, ["--backend", "chorus", *args, "--timeout", str(timeout_s),
                                 "--fail", spec], env=env, nodes=nodes, python=python)
    survivors = [r for r in rs if r.rank != victim]
    ranks.finish(survivors, timeout_s + 120)
    rs[victim].proc.kill()  # a stopped one is still there
    ranks.finish([rs[victim]], 30)
    report = ranks.report(rs)
    test.assertIn("rank %d: %s itself at step %d, before its %s" % (victim, signal, STEP, phase),
                  rs[victim].err, report)
    lines = []
    for r in survivors:
        test.assertEqual(r.rc, 1, report)  # None: still running at the deadline
        said = [l for l in r.err.splitlines() if l.startswith("rank %d failed at step " % r.rank)]
        test.assertEqual(len(said), 1, report)
        line = said[0]
        test.assertIn("rank %d failed at step %d: " % (r.rank, STEP), line)
        test.assertIn(OPERATION[phase], line)
        test.assertIn("rank %d (host " % victim, line)
        lines.append(line)
        print("  %s" % line[:400], file=sys.stderr)  # what each survivor said, for the log
    return lines
