"""The table and the step profile of a bench/compare_recsys.sh run, from its folder.

    recsys_report.py WORK --worlds "2 4" --nodes "1 2" [--header TEXT] [--skip-torchrec WHY]

WORK holds each run's rank logs (JOB.BACKEND.WxN.ROUND.K.log), its profile folder
(JOB.BACKEND.WxN.ROUND.prof/rank<K>.json, step_profile.py) and, for a failed run,
JOB.BACKEND.WxN.ROUND.failed. gloo runs once per rank count (it ignores
CHORUS_NODE_ID), at the first node count; its numbers serve every node row.

Prints the table (x = chorus's speed over gloo's: samples/s over samples/s, or gloo's
time over chorus's), the targets, and the step profiles: for each job, rank count, node
count and backend, the mean step (steps 2 on, the mean over ranks) of the run with the
best samples/s, in milliseconds by phase, where each collective's time is split into
the wait for the last rank to issue it ("peers") and the rest. Writes the profile
table to WORK/recsys_profile.dat and, where gnuplot is installed, recsys_profile.png.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

JOBS = {"trec_tw": "TorchRec DLRM, table-wise", "trec_rw": "TorchRec DLRM, row-wise",
        "sharded": "hand-sharded DLRM"}
COLL = {  # name: (label, is an all_to_all of a job)
    "trec_tw_splits": ("a2a TorchRec counts, no splits", True),
    "trec_tw_lengths": ("a2a TorchRec tw lengths", True),
    "trec_tw_ids": ("a2a TorchRec tw ids", True),
    "trec_tw_pooled": ("a2a TorchRec tw pooled emb.", True),
    "trec_rw_ids": ("a2a TorchRec rw ids, uneven", True),
    "trec_rw_rs": ("reduce_scatter TorchRec rw", False),
    "trec_rw_ag": ("all_gather TorchRec rw (bwd)", False),
    "sharded_a2a": ("a2a hand-sharded butterfly", True),
    "sparse_ar": ("sparse all_reduce, 1 table", False),
}
NAME = re.compile(r"^(?P<job>\w+)\.(?P<backend>gloo|chorus)\.(?P<world>\d+)x(?P<nodes>\d+)"
                  r"\.(?P<round>\d+)$")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    p.add_argument("--worlds", default="2 4")
    p.add_argument("--nodes", default="1 2")
    p.add_argument("--header", default="")
    p.add_argument("--skip-torchrec", default="")
    args = p.parse_args()
    args.worlds = [int(w) for w in args.worlds.split()]
    args.nodes = [int(n) for n in args.nodes.split()]
    return args


def runs(work):
    """name -> its fields, for every run in WORK."""
    found = {}
    for path in glob.glob(os.path.join(work, "*.0.log")):
        name = os.path.basename(path)[:-len(".0.log")]
        m = NAME.match(name)
        if m:
            found[name] = dict(m.groupdict(), world=int(m["world"]), nodes=int(m["nodes"]))
    return found


def read_results(work, found):
    """(best, failures): best[(job, backend, world, nodes)] = (value, run name), the
    highest samples/s or the lowest time (coll rows: job = coll/NAME); failures[key] =
    the last reason seen."""
    best, failures, notes = {}, {}, {}
    for name, f in found.items():
        base = (f["backend"], f["world"], f["nodes"])
        failed = os.path.join(work, name + ".failed")
        if os.path.exists(failed):
            failures[(f["job"],) + base] = open(failed).read().strip()
        for line in open(os.path.join(work, name + ".0.log"), errors="replace"):
            w = line.split()
            if f["job"] != "coll" and line.startswith("samples/s "):
                key, value, better = (f["job"],) + base, float(w[1]), max
            elif f["job"] == "coll" and w[:1] == ["coll"]:
                key, value, better = ("coll/" + w[3],) + base, float(w[5]), min
                notes[(w[3], f["world"])] = (int(w[4]), " ".join(w[6:]))
            elif f["job"] == "coll" and w[:1] == ["floor"]:
                key, value, better = ("floor/" + w[3], f["world"]), float(w[5]), min
            elif f["job"] == "coll" and w[:1] == ["error"]:
                failures[("coll/" + w[3],) + base] = " ".join(w[4:])
                continue
            else:
                continue
            if key not in best or better(best[key][0], value) == value:
                best[key] = (value, name)
    return best, failures, notes


def lookup(table, key, first_nodes):
    """gloo's row for any node count is its run at the first node count."""
    job, backend, world, nodes = key
    if backend == "gloo":
        key = (job, backend, world, first_nodes)
    return table.get(key)


def fmt_bytes(n):
    for unit, v in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n / v:.4g} {unit}"
    return f"{n} B"


def short(text, width=70):
    return text if len(text) <= width else text[:width - 3] + "..."


def table(args, best, failures, notes):
    first = args.nodes[0]
    ratios = {}  # key (job, world, nodes) -> x
    print(f"{'ranks':>5} {'nodes':>5}  {'row':<31} {'per rank':>12} {'gloo':>10} {'chorus':>10}"
          f" {'x':>6} {'floor':>7} {'x max':>6}")
    rows = [j for j in JOBS if not (args.skip_torchrec and j.startswith("trec"))] + \
        ["coll/" + c for c in COLL]
    for world in args.worlds:
        for nodes in args.nodes:
            for job in rows:
                g = lookup(best, (job, "gloo", world, nodes), first)
                c = best.get((job, "chorus", world, nodes))
                if job.startswith("coll/"):
                    label = COLL[job[5:]][0]
                    note = notes.get((job[5:], world))
                    size = fmt_bytes(note[0]) if note else "-"
                    unit = "us"
                else:
                    label, size, unit = JOBS[job], "samples/s", ""
                cells = [f"{v[0]:>10.1f}" if v else f"{'-':>10}" for v in (g, c)]
                line = f"{world:>5} {nodes:>5}  {label:<31} {size:>12} " + " ".join(cells)
                if g and c:
                    x = c[0] / g[0] if unit == "" else g[0] / c[0]
                    ratios[(job, world, nodes)] = x
                    line += f" {x:>6.2f}"
                    floor = best.get(("floor/" + job[5:], world)) if nodes > 1 else None
                    if floor:
                        line += f" {floor[0]:>7.1f} {g[0] / floor[0]:>6.2f}"
                else:
                    why = [f"{b}: {short(lookup(failures, (job, b, world, nodes), first) or 'no result')}"
                           for b, v in (("gloo", g), ("chorus", c)) if not v]
                    line += f" {'-':>6}   " + "; ".join(why)
                print(line)
            print()
    if args.skip_torchrec:
        print(f"# TorchRec's rows skipped: {args.skip_torchrec}")
    return ratios


def targets(args, ratios):
    print("# targets (x = chorus / gloo)")
    jobs = [j for j in JOBS if not (args.skip_torchrec and j.startswith("trec"))]
    for job in jobs:
        for world in args.worlds:
            x = ratios.get((job, world, 2))
            goal = "met" if x is not None and x >= 1.5 else "missed"
            shown = f"{x:.2f}" if x is not None else "not measured"
            print(f"{JOBS[job]} samples/s, {world} ranks on 2 simulated nodes: {shown}"
                  f" (target >= 1.5): {goal}")
    a2a = {k: v for k, v in ratios.items() if k[0].startswith("coll/") and COLL[k[0][5:]][1]}
    expected = sum(1 for c in COLL.values() if c[1]) * len(args.worlds) * len(args.nodes)
    if a2a:
        low = min(a2a, key=a2a.get)
        missed = sorted(k for k, v in a2a.items() if v < 3)
        print(f"all_to_all at the jobs' sizes: min {a2a[low]:.2f} ({COLL[low[0][5:]][0]}, "
              f"{low[1]} ranks, {low[2]} node(s)), {len(a2a) - len(missed)} of {expected} "
              f"rows >= 3 (target >= 3 on every row): "
              f"{'met' if not missed and len(a2a) == expected else 'missed'}")
    else:
        print("all_to_all at the jobs' sizes: not measured (target >= 3): missed")


def load_profile(folder):
    ranks = []
    for path in sorted(glob.glob(os.path.join(folder, "rank*.json"))):
        with open(path) as f:
            ranks.append(json.load(f))
    return ranks


def split_waits(ranks):
    """Per rank, per step: the phases with each collective's wait for the last rank
    to issue it moved to "peers". Collectives match across ranks by their order in the
    step (every rank issues them in one order)."""
    out = []
    for r, prof in enumerate(ranks):
        steps = []
        for s, step in enumerate(prof["steps"]):
            phases = dict(step["phases"])
            for i, c in enumerate(step["collectives"]):
                if c["wait"] is None:
                    continue
                try:
                    last = max(o["steps"][s]["collectives"][i]["issue"] for o in ranks)
                except (IndexError, KeyError):
                    continue
                peers = min(max(0.0, last - c["wait"]), c["leave"] - c["wait"])
                phases[c["name"]] = phases.get(c["name"], 0.0) - peers
                phases["peers"] = phases.get("peers", 0.0) + peers
            steps.append((step["step"], step["end"] - step["start"], phases))
        out.append(steps)
    return out


def mean_step(ranks, first_step=2):
    """(step ms, {phase: ms}): the mean over ranks of each rank's mean step."""
    per_rank = split_waits(ranks)
    total, phases, n_ranks = 0.0, {}, 0
    for steps in per_rank:
        kept = [s for s in steps if s[0] >= first_step] or steps
        if not kept:
            continue
        n_ranks += 1
        total += sum(s[1] for s in kept) / len(kept) * 1e3
        for _, _, ph in kept:
            for k, v in ph.items():
                phases[k] = phases.get(k, 0.0) + v / len(kept) * 1e3
    if not n_ranks:
        return None
    return total / n_ranks, {k: v / n_ranks for k, v in phases.items()}


# The plot's segments: (label, phases summed into it); the rest goes to "other".
SEGMENTS = {
    "sharded": [("input", ["input"]), ("lookups", ["lookup_fwd", "lookup_bwd"]),
                ("MLPs", ["mlp_fwd", "mlp_bwd"]), ("optimizer", ["optimizer"]),
                ("a2a fwd", ["a2a_fwd"]), ("a2a bwd", ["a2a_bwd"]),
                ("DDP allreduce wait", ["ddp_wait"]), ("loss allreduce", ["loss_allreduce"]),
                ("waiting for peers", ["peers"])],
    "trec": [("input", ["input"]), ("forward (lookups, MLPs)", ["forward"]),
             ("backward (lookups+update, MLPs, DDP)", ["backward"]),
             ("optimizer", ["optimizer"]),
             ("a2a fwd", ["all_to_all_single/forward"]),
             ("a2a bwd", ["all_to_all_single/backward"]),
             ("reduce_scatter fwd", ["reduce_scatter_tensor/forward", "reduce_scatter/forward"]),
             ("all_gather bwd", ["all_gather_into_tensor/backward", "all_gather/backward"]),
             ("loss allreduce", ["loss_allreduce", "all_reduce/loss_allreduce"]),
             ("waiting for peers", ["peers"])],
}


def segments(job, phases):
    kind = "sharded" if job == "sharded" else "trec"
    used, values = set(), []
    for _, names in SEGMENTS[kind]:
        values.append(sum(phases.get(n, 0.0) for n in names))
        used.update(names)
    values.append(sum(v for k, v in phases.items() if k not in used))
    return [label for label, _ in SEGMENTS[kind]] + ["other"], values


def profiles(args, work, best):
    print()
    print("# step profiles: the mean step (steps 2 on, mean over ranks) of each job's best"
          " run, ms; 'waiting for peers': in a collective, until the last rank had issued it")
    dat = []
    for job in [j for j in JOBS if not (args.skip_torchrec and j.startswith("trec"))]:
        header_printed = False
        for world in args.worlds:
            for nodes in args.nodes:
                for backend in ("gloo", "chorus"):
                    if backend == "gloo" and nodes != args.nodes[0]:
                        continue
                    run = best.get((job, backend, world, nodes))
                    if not run:
                        continue
                    got = mean_step(load_profile(os.path.join(work, run[1] + ".prof")))
                    if not got:
                        continue
                    step_ms, phases = got
                    labels, values = segments(job, phases)
                    if not header_printed:
                        print(f"{JOBS[job]}: " + " | ".join(labels))
                        header_printed = True
                    where = f"{backend} {world}r" + ("" if backend == "gloo" else f" {nodes}n")
                    print(f"  {where:<14} step {step_ms:7.1f}: " +
                          " ".join(f"{v:6.1f}" for v in values))
                    dat.append((job, where, labels, values))
    return dat


def plot(work, dat):
    """recsys_profile.dat: one block per job (gnuplot index), one row per bar; the
    stacked bars drawn into recsys_profile.png."""
    if not dat:
        return
    path = os.path.join(work, "recsys_profile.dat")
    jobs = []
    with open(path, "w") as f:
        for job, where, labels, values in dat:
            if job not in jobs:
                if jobs:
                    f.write("\n\n")
                jobs.append(job)
                f.write("bar " + " ".join('"%s"' % l for l in labels) + "\n")
            f.write('"%s" ' % where + " ".join(f"{v:.3f}" for v in values) + "\n")
    if shutil.which("gnuplot") is None:
        print("# no gnuplot: the profile is in " + path)
        return
    png = os.path.join(work, "recsys_profile.png")
    ncols = {job: len(labels) for job, _, labels, _ in dat}
    script = [f'set terminal pngcairo size 1400,{420 * len(jobs)} font ",10"',
              f'set output "{png}"', "set termoption noenhanced", "set style data histograms",
              "set style histogram rowstacked", "set style fill solid 0.9 border -1",
              "set boxwidth 0.7", "set key outside right top vertical",
              "set ylabel 'ms per step (mean over ranks)'", "set grid ytics",
              "set xtics rotate by -30", f"set multiplot layout {len(jobs)},1"]
    colors = ["#9e9e9e", "#2e7d32", "#64b5f6", "#f9a825", "#ef6c00", "#c62828", "#6a1b9a",
              "#00838f", "#d81b60", "#fdd835", "#5d4037", "#000000"]
    script += [f'set linetype {i + 1} lc rgb "{c}"' for i, c in enumerate(colors)]
    for i, job in enumerate(jobs):
        script.append(f"set title '{JOBS[job]}: where a step goes, per backend, "
                      "ranks (r) and simulated nodes (n)'")
        script.append(f"plot for [c=2:{ncols[job] + 1}] '{path}' index {i} using c:xtic(1) "
                      "title columnheader(c)")
    script.append("unset multiplot")
    result = subprocess.run(["gnuplot"], input="\n".join(script), text=True,
                            capture_output=True, timeout=120)
    if result.returncode != 0:
        print("# gnuplot failed: " + result.stderr.strip().splitlines()[-1])
    else:
        print("# plot: " + png)


def main():
    args = parse_args()
    found = runs(args.work)
    best, failures, notes = read_results(args.work, found)
    print(f"# recommendation jobs, gloo vs chorus: {args.header}")
    print("# x = chorus speed / gloo speed (samples/s over samples/s, gloo time over chorus"
          " time); gloo talks tcp over loopback whatever the node count: its 1-node run"
          " serves the 2-node rows")
    print("# collectives: median call, slowest rank, us; 'per rank': what one rank sends"
          " (sparse: its gradient's indices and values)")
    print("# floor (2 ranks on 2 nodes): the same bytes each way over one plain tcp connection,"
          " no library, us; x max = gloo / floor: chorus's x if it took no time beyond tcp's")
    ratios = table(args, best, failures, notes)
    targets(args, ratios)
    plot(args.work, profiles(args, args.work, best))


if __name__ == "__main__":
    sys.exit(main())
