"""The report of bench/validate_sim.sh: fits the simulator's link model to the
calibration runs of each rate, runs chorus-sim at every measured point, and prints
measured, simulated and their ratio.

Usage: validate_sim.py DIR CHORUS_SIM

DIR holds what validate_sim.sh measured: `rates`, `cases`, `iters` ("N_SMALL N_LARGE
LARGE WARMUP_LARGE"), `reduce.txt` (reduce-bench's table) and per rate a directory of chorus-bench
JSON rows: cal.inter.rK.json (2 hosts x 1, sendrecv), cal.intra.rK.json (1 host x 2),
cal.load8x1.rK.json and cal.load8x2.rK.json (8 hosts x 1 and x 2, small sizes), and
CASE.rK.json per case and repeat K.

The parameters (times in the simulator's units):
  * between hosts: inter_beta = nic = the rate of the ping-pong's slope between its two
    largest sizes, at their fastest repeats (a 2-rank sendrecv is two one-way trips);
    inter_alpha fitted so that
    chorus-sim's sendrecv gives the measured time at 8 B..512 B (the median of the
    sizes' fits): from 2 ranks ("a2"), and from the 8 x 1 or 8 x 2 exchange for the
    cases of that layout ("aL": the latency with as many processes on this machine's
    cores as the case has);
  * inside a host: intra_alpha and intra_beta the same way from 1 host x 2 ranks;
  * reduce_rate: reduce-bench's f32 sum at 1 MiB with the kernels chorus picks, divided
    by 3 (it counts two inputs and the output; the simulator counts the output).
The latencies are fitted to the medians over the repeats.
"""
import json
import math
import os
import re
import statistics
import subprocess
import sys

SMALL_FIT = (8, 64, 512)  # sizes whose sendrecv times give alpha
LAYOUTS = {"8x1": (8, 1), "8x2": (16, 2)}
SIM_ALGO = {("ar", "ring"): ("allreduce", "ring"), ("ar", "hier"): ("allreduce", "hierarchical"),
            ("ag", "ring"): ("allgather", "ring"), ("ag", "bruck"): ("allgather", "bruck"),
            ("bc", "ring"): ("broadcast", "chain")}
BENCH_ALGO = {"ring": "ring", "hier": "hier", "bruck": "bruck"}  # chorus-bench's "algo"


def fail(message):
    sys.exit(f"validate_sim: {message}")


def rows(path):
    """{size: time_us} of one chorus-bench JSON file; fails on wrong results."""
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["wrong"]:
                fail(f"{path}: {r['wrong']} wrong elements at {r['size']} bytes")
            out[r["size"]] = (r["time_us"], r["algo"])
    return out


def medians(run_dir, prefix, repeats):
    """{size: [time_us of each repeat]} over prefix.r1..rK.json."""
    per = {}
    for k in range(1, repeats + 1):
        for size, (us, _) in rows(f"{run_dir}/{prefix}.r{k}.json").items():
            per.setdefault(size, []).append(us)
    return per


class Sim:
    def __init__(self, binary):
        self.binary, self.cache = binary, {}

    def time_us(self, collective, algorithm, ranks, per_node, size, iters, m):
        """chorus-sim's time for chorus-bench's row: iters = (timed, warm-up)."""
        args = (collective, algorithm, ranks, per_node, size, iters, tuple(sorted(m.items())))
        if args not in self.cache:
            cmd = [self.binary, "--json", "-o", collective, "-a", algorithm, "-n", str(ranks),
                   "--ranks-per-node", str(per_node), "--bytes", str(size), "--bench-iters", str(iters[0]),
                   "--bench-warmup", str(iters[1])]
            for key, value in sorted(m.items()):
                cmd += [f"--{key}", repr(value)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                fail(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
            self.cache[args] = json.loads(done.stdout)["time_us"]
        return self.cache[args]


def fit_alpha(sim, measured, ranks, per_node, key, model, iters):
    """The latency `key` (an alpha option, us) with which chorus-sim's sendrecv on this
    layout gives the measured times at SMALL_FIT: the simulated time is affine in it."""
    fits = []
    for size in SMALL_FIT:
        at = lambda a: sim.time_us("sendrecv", "shift", ranks, per_node, size, iters, {**model, key: a})
        t0, t100 = at(0.0), at(100.0)
        fits.append(100.0 * (statistics.median(measured[size]) - t0) / (t100 - t0))
    return max(0.0, statistics.median(fits)), fits


def slope_gbs(measured):
    """GB/s of one way of a ping-pong, from its two largest sizes, each at its fastest
    repeat: other jobs on the machine only ever slow a sample down (one 16 MiB ping-pong
    at 1 Gbit/s took 280, 669 and 340 ms in three repeats at load 15 to 22)."""
    a, b = sorted(measured)[-2:]
    return 2 * (b - a) / ((min(measured[b]) - min(measured[a])) * 1e3)


def reduce_gbs(path):
    text = open(path).read()
    isa = re.search(r"instruction set chosen on this CPU: (\w+)", text).group(1)
    head = next(l for l in text.splitlines() if l.startswith("dtype")).split()
    row = next(l for l in text.splitlines() if l.startswith("f32") and "1 MiB" in l)
    cells = re.findall(r"\d+\.\d+(?: \(\s*\d+\.\d+x\))?", row)
    gbs = float(cells[head.index(isa) - 2].split()[0])
    return gbs / 3, isa


def tbf_burst(rate):
    """scripts/netns-cluster.sh's tbf burst at `rate`: 1 ms of it, at least 32 KiB."""
    m = re.fullmatch(r"(\d+)(k|m|g)bit", rate.lower())
    bits = int(m.group(1)) * {"k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)]
    return max(bits // 8 // 1000, 32768), bits / 8e9


def show(label, measured):
    print(f"  {label:<36}" + ", ".join(f"{size_name(s)} {statistics.median(t):.1f}" for s, t in sorted(measured.items())))


def calibrate(sim, root, rate, repeats, reduce_rate):
    """The models of one rate: "plain" (the alpha-beta model with the NIC at the measured
    rate) and "tbf" (the NIC a token bucket of tbf's burst, passing at the unshaped
    veth's rate while it has tokens), each with its latencies: a2 from 2 ranks and aL
    per layout from the exchange on that layout."""
    run_dir = f"{root}/{rate}"
    inter = medians(run_dir, "cal.inter", repeats)
    wire = medians(f"{root}/wire", "cal.inter", len([f for f in os.listdir(f"{root}/wire") if f.endswith(".json")]))
    intra = medians(run_dir, "cal.intra", repeats)
    load = {lay: medians(run_dir, f"cal.load{lay}", repeats) for lay in LAYOUTS}
    beta, line, intra_beta = slope_gbs(inter), slope_gbs(wire), slope_gbs(intra)
    burst, nominal = tbf_burst(rate)
    show("ping-pong 2 hosts x 1 (us):", inter)
    show("same, unshaped veth (us):", wire)
    show("ping-pong 1 host x 2, shm (us):", intra)
    for lay in LAYOUTS:
        show(f"sendrecv on {lay} (us):", load[lay])
    print(f"  rates: shaped link {beta:.4f} GB/s ({beta / nominal:.3f} of {rate}: tbf counts the headers), "
          f"unshaped veth {line:.2f} GB/s, shared memory {intra_beta:.2f} GB/s; reduction {reduce_rate:.2f} GB/s output")
    plain = {"inter-gbs": beta, "nic-gbs": beta, "intra-gbs": intra_beta, "reduce-gbs": reduce_rate,
             "intra-alpha-us": 0.0, "inter-alpha-us": 0.0}
    # The burst in payload bytes, as the rate: tbf counts whole frames.
    tbf = {**plain, "inter-gbs": line, "nic-burst": int(burst * beta / nominal)}
    models = {}
    for name, base in (("plain", plain), ("tbf", tbf)):
        intra_alpha, intra_fits = fit_alpha(sim, intra, 2, 2, "intra-alpha-us", base, (20, 3))
        base["intra-alpha-us"] = intra_alpha
        a2, a2_fits = fit_alpha(sim, inter, 2, 1, "inter-alpha-us", base, (20, 3))
        loaded = {lay: fit_alpha(sim, load[lay], *LAYOUTS[lay], "inter-alpha-us", base, (50, 5))[0]
                  for lay in LAYOUTS}
        models[name] = (base, a2, loaded)
        print(f"  {name} model: alpha between hosts a2 {a2:.1f} us (fits {', '.join(f'{f:.1f}' for f in a2_fits)})"
              + "".join(f", aL {lay} {loaded[lay]:.1f} us" for lay in LAYOUTS)
              + f"; inside a host {intra_alpha:.2f} us (fits {', '.join(f'{f:.2f}' for f in intra_fits)})"
              + (f"; burst {base['nic-burst']} B" if name == "tbf" else ""))
    return models


def size_name(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def band(size):
    return "1-16 KiB" if size <= 16 << 10 else ("64 KiB-1 MiB" if size <= 1 << 20 else "4-64 MiB")


def far(r):
    return abs(math.log(r))


def net_line(run_dir, prefix, repeats, large):
    """"tbf drops / TCP retransmits / TCP timeouts in a run of the sizes", medians over
    the repeats, from PREFIX.rK.net (lines "FIRST_SIZE DROPS RETRANS TIMEOUTS", one per
    band of sizes)."""
    bands = {}
    for k in range(1, repeats + 1):
        path = f"{run_dir}/{prefix}.r{k}.net"
        if not os.path.exists(path):  # measured before the script counted them
            return "losses not counted"
        for line in open(path):
            first, *counts = map(int, line.split())
            bands.setdefault(first <= large, []).append(counts)
    parts = [f"{'to' if small else 'above'} {size_name(large)}: "
             + " / ".join(f"{statistics.median(c[i] for c in v):.0f}" for i in range(len(v[0])))
             for small, v in sorted(bands.items(), reverse=True)]
    return "tbf drops / TCP retransmits / TCP timeouts in a run of the sizes " + ", ".join(parts)


COLUMNS = (("plain a2", "plain", False), ("plain aL", "plain", True), ("tbf aL", "tbf", True))


def main():
    if len(sys.argv) != 3:
        fail("usage: validate_sim.py DIR CHORUS_SIM")
    root, sim = sys.argv[1], Sim(sys.argv[2])
    rates = open(f"{root}/rates").read().split()
    cases = open(f"{root}/cases").read().split()
    # "N_SMALL N_LARGE LARGE [WARMUP_LARGE]": runs before the field was written had 1.
    n_small, n_large, large, *rest = map(int, open(f"{root}/iters").read().split())
    warm_large = rest[0] if rest else 1
    reduce_rate, isa = reduce_gbs(f"{root}/reduce.txt")
    summary = []
    for rate in rates:
        run_dir = f"{root}/{rate}"
        repeats = len([f for f in os.listdir(run_dir) if re.fullmatch(r"cal\.inter\.r\d+\.json", f)])
        loads = [l for l in open(f"{run_dir}/load").read().split("\n") if l]
        print(f"\n## link {rate}, {repeats} repeats; load average (1/5/15 min) at each repeat's start and at the end: "
              + "; ".join(loads))
        print(f"calibration (times: medians of the repeats; rates: slopes of the fastest; {isa} reduction kernels):")
        models = calibrate(sim, root, rate, repeats, reduce_rate)
        for case in cases:
            coll, algo, layout = case.split(".")
            ranks, per_node = LAYOUTS[layout]
            collective, algorithm = SIM_ALGO[(coll, algo)]
            per = {}
            for k in range(1, repeats + 1):
                for size, (us, got) in rows(f"{run_dir}/{case}.r{k}.json").items():
                    if got != BENCH_ALGO[algo]:
                        fail(f"{case} ran algorithm {got} at {size} bytes, not {BENCH_ALGO[algo]}")
                    per.setdefault(size, []).append(us)
            print(f"\n{collective} {algorithm}, {layout.replace('x', ' hosts x ')} rank(s), link {rate}; "
                  + net_line(run_dir, case, repeats, large) + "; "
                  f"us per op (measured: chorus-bench, median of {repeats} repeats, spread (max-min)/median; "
                  f"simulated: chorus-sim, the same iterations); ratio = measured / simulated")
            print(f"{'size':>9} {'measured':>11} {'spread':>7}" + "".join(f" {c:>11} {'ratio':>6}" for c, _, _ in COLUMNS))
            for size in sorted(per):
                t = per[size]
                med = statistics.median(t)
                iters = (n_small, 2) if size <= large else (n_large, warm_large)
                ratios = []
                line = f"{size_name(size):>9} {med:11.1f} {(max(t) - min(t)) / med:7.0%}"
                for _, name, use_loaded in COLUMNS:
                    base, a2, loaded = models[name]
                    alpha = loaded[layout] if use_loaded else a2
                    us = sim.time_us(collective, algorithm, ranks, per_node, size, iters,
                                     {**base, "inter-alpha-us": alpha})
                    ratios.append(med / us)
                    line += f" {us:11.1f} {med / us:6.2f}"
                print(line)
                summary.append(((rate, case, band(size)), ratios))
    print("\n## how close: measured / simulated per size band, the median and the worst (furthest from 1)")
    print(f"{'link':>8} {'case':>13} {'sizes':>13}" + "".join(f" {c + ' med':>13} {'worst':>6}" for c, _, _ in COLUMNS))
    keys = list(dict.fromkeys(k for k, _ in summary))
    for key in keys:
        got = [r for k, r in summary if k == key]
        line = f"{key[0]:>8} {key[1]:>13} {key[2]:>13}"
        for i in range(len(COLUMNS)):
            col = [r[i] for r in got]
            line += f" {statistics.median(col):13.2f} {max(col, key=far):6.2f}"
        print(line)


if __name__ == "__main__":
    main()
