"""Compares the "loss step=S value=V global=G" lines of two torchrec_dlrm.py runs.

    python compare_losses.py A.txt B.txt

Prints the number of steps, the largest absolute and relative difference of V and of G,
and whether the two are bit for bit equal; exits 1 when the steps differ in number.
"""
import re
import sys

LINE = re.compile(r"^loss step=(\d+) value=(\S+) global=(\S+)$")


def losses(path):
    with open(path) as f:
        return [(float(m.group(2)), float(m.group(3)))
                for m in map(LINE.match, f) if m]


def main(a_path, b_path):
    a, b = losses(a_path), losses(b_path)
    if len(a) != len(b) or not a:
        print(f"steps differ: {len(a)} against {len(b)}")
        return 1
    for i, what in enumerate(("value", "global")):
        diffs = [abs(x[i] - y[i]) for x, y in zip(a, b)]
        rel = [d / abs(x[i]) if x[i] else d for d, x in zip(diffs, a)]
        same = all(x[i] == y[i] for x, y in zip(a, b))
        print(f"{what}: steps={len(a)} max_abs={max(diffs):.3g} max_rel={max(rel):.3g} "
              f"bitwise_equal={same}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
