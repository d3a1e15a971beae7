"""Starts the ranks of a torch.distributed job as processes on this machine (env://,
127.0.0.1) and collects what each printed. Used by the torch_py tests."""
import os
import socket
import subprocess
import sys
import time

# The Python whose torch the ranks run: Debian's by default, a torch 2.x environment's
# under build-torch2 (tests/CMakeLists.txt sets CHORUS_TEST_PYTHON).
PYTHON = os.environ.get("CHORUS_TEST_PYTHON", "/usr/bin/python3")
HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def __init__(self, rank, proc):
        self.rank, self.proc = rank, proc
        self.out = self.err = ""
        self.rc = None


def start(script, world_size, args=(), env=None, nodes=1, rank_env=None, python=None):
    """Starts `world_size` ranks of `script` (run by `python`, PYTHON by default); with
    nodes > 1 the ranks are split into that many simulated nodes (CHORUS_NODE_ID), which
    talk tcp to each other. `env` adds variables (None: unset it), `rank_env(rank)`
    those of one rank."""
    port = free_port()
    ranks = []
    per_node = world_size // nodes
    for r in range(world_size):
        e = dict(os.environ)
        for name, value in (env or {}).items():
            if value is None:
                e.pop(name, None)
            else:
                e[name] = value
        e.update(RANK=str(r), WORLD_SIZE=str(world_size), LOCAL_RANK=str(r % per_node),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        # A rank that dies by a signal (SIGSEGV, SIGABRT) prints every thread's Python
        # stack on stderr, which report() shows.
        e.setdefault("PYTHONFAULTHANDLER", "1")
        if nodes > 1:
            e["CHORUS_NODE_ID"] = "simnode%d" % (r // per_node)
        if rank_env:
            e.update(rank_env(r))
        proc = subprocess.Popen([python or PYTHON, os.path.join(HERE, script), *args], env=e,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ranks.append(Rank(r, proc))
    return ranks


def finish(ranks, timeout):
    """Waits for every rank until `timeout` seconds from now; kills those still running
    then (their rc is None)."""
    deadline = time.monotonic() + timeout
    for r in ranks:
        try:
            r.out, r.err = r.proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            r.rc = r.proc.returncode
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.out, r.err = r.proc.communicate()
    return ranks


def run(script, world_size, args=(), env=None, nodes=1, timeout=300):
    return finish(start(script, world_size, args, env, nodes), timeout)


def report(ranks):
    return "\n".join("--- rank %d rc=%s\n%s%s" % (r.rank, r.rc, r.out[-3000:], r.err[-3000:])
                     for r in ranks)
