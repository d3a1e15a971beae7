#!/usr/bin/python3
"""Writes tests/torch/fixtures/sampler_fixture.json: the indices that PyTorch's
torch.utils.data.DistributedSampler yields over a grid of arguments, for
tests/torch/sampler_test.cc to compare chorus's DistributedSampler against.

Run with Debian's interpreter, which has torch (python3-torch):
    /usr/bin/python3 scripts/gen_sampler_fixture.py

Small datasets store every index. Large ones store the first FIRST_COUNT
indices and an FNV-1a checksum of the whole list (one xor and one multiply per
index, modulo 2**64), to keep the fixture small.
"""
import json
import os

import torch
from torch.utils.data import DistributedSampler

SMALL_LENGTHS = [0, 1, 2, 3, 5, 7, 10, 13]
LARGE_LENGTHS = [10001, 60000]
FIRST_COUNT = 32
FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211


def fnv1a64(indices):
    h = FNV_OFFSET
    for v in indices:
        h = ((h ^ v) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def sampler_indices(n, num_replicas, rank, shuffle, seed, drop_last, epoch):
    # The sampler only calls len() on its dataset.
    sampler = DistributedSampler(range(n), num_replicas=num_replicas, rank=rank,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    indices = list(sampler)
    assert len(indices) == len(sampler)
    return indices


def shuffles():
    """(shuffle, seed, epoch): without shuffling, seed and epoch change nothing,
    so one of those cases stands for all six."""
    yield False, 0, 0
    for seed in (0, 42):
        for epoch in range(3):
            yield True, seed, epoch


def cases():
    for n in SMALL_LENGTHS + LARGE_LENGTHS:
        for num_replicas in range(1, 5):
            for rank in range(num_replicas):
                for drop_last in (False, True):
                    for shuffle, seed, epoch in shuffles():
                        yield dict(n=n, num_replicas=num_replicas, rank=rank,
                                   shuffle=shuffle, seed=seed, drop_last=drop_last,
                                   epoch=epoch)


def record(case):
    indices = sampler_indices(**case)
    case = dict(case, num_samples=len(indices))
    if case["n"] in SMALL_LENGTHS:
        case["indices"] = indices
    else:
        case["first"] = indices[:FIRST_COUNT]
        case["fnv1a64"] = "%016x" % fnv1a64(indices)
    return case


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "torch", "fixtures", "sampler_fixture.json")
    lines = [json.dumps(record(c), separators=(",", ":")) for c in cases()]
    with open(path, "w") as out:
        out.write('{"torch_version":%s,"first_count":%d,"cases":[\n' %
                  (json.dumps(torch.__version__), FIRST_COUNT))
        out.write(",\n".join(lines))
        out.write("\n]}\n")
    print("wrote %d cases to %s" % (len(lines), path))


if __name__ == "__main__":
    main()
