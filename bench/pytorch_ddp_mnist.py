"""chorus-mnist's job (seed 000) in PyTorch DDP over gloo, for bench/compare_mnist.sh.

MLP 784-512-512-10 on torchvision's FashionMNIST (ToTensor), torch.manual_seed(0) before
the model is built, SGD lr 1e-3, global batch 512 split across the ranks,
DistributedSampler (seed 0, shuffled), DataLoader with drop_last and --workers worker
processes (default 1, as the seed and chorus-mnist's --workers 1), one intra-op thread
per rank. Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
GLOO_SOCKET_IFNAME) set; no torchrun.

--max-steps counts every optimizer step, as in chorus-mnist; the first --warmup-steps
are not timed. Rank 0 prints chorus-mnist's JSON line, samples_per_second being the
samples of all ranks over the timed steps divided by rank 0's time in them.
"""
import argparse
import gzip
import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets
from torchvision.transforms import ToTensor


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the gzipped IDX files")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=512, help="global, split across ranks")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    p.add_argument("--max-steps", type=int, default=0, help="0: no limit")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    a = p.parse_args()
    if a.max_steps and a.warmup_steps >= a.max_steps:
        p.error("--warmup-steps must be below --max-steps")
    return a


def load_fashion_mnist(data_dir, root):
    """torchvision wants root/FashionMNIST/raw/ with the files unpacked; nothing is downloaded."""
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(os.path.join(data_dir, name + ".gz")) as src, \
                open(os.path.join(raw, name), "wb") as dst:
            shutil.copyfileobj(src, dst)
    return datasets.FashionMNIST(root=root, train=True, download=False, transform=ToTensor())


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch_size % world:
        raise SystemExit(f"--batch-size {a.batch_size} is not divisible by the {world} ranks")
    with tempfile.TemporaryDirectory(prefix="pytorch_ddp_mnist.") as root:
        training_data = load_fashion_mnist(a.data_dir, root)
    torch.manual_seed(a.seed)
    model = DistributedDataParallel(NeuralNetwork())
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr)
    sampler = DistributedSampler(training_data, seed=a.seed)
    loader = DataLoader(training_data, batch_size=a.batch_size // world, sampler=sampler,
                        num_workers=a.workers, drop_last=True)

    step = timed_samples = 0
    train_seconds = 0.0
    wall_start = time.perf_counter()
    stop = False
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step <= a.warmup_steps:
                start = time.perf_counter()
            else:
                timed_samples += len(y) * world
            if a.max_steps and step >= a.max_steps:
                stop = True
                break
        if step > a.warmup_steps:
            train_seconds += time.perf_counter() - start
        if stop:
            break
    if rank == 0:
        print(json.dumps({"epochs": a.epochs, "ranks": world, "steps": step,
                          "warmup_steps": a.warmup_steps, "workers": a.workers,
                          "samples_per_second": timed_samples / train_seconds if train_seconds else 0.0,
                          "train_seconds": train_seconds,
                          "wall_time_s": time.perf_counter() - wall_start,
                          "loss": loss.item(), "blas": openblas_core()}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def openblas_core():
    """The kernels OpenBLAS chose when torch loaded it ("" when torch is not on OpenBLAS)."""
    import ctypes
    try:  # the library torch loaded: dlopen returns the same instance
        name = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD).openblas_get_corename
    except (OSError, AttributeError):
        return ""
    name.restype = ctypes.c_char_p
    return name().decode()


if __name__ == "__main__":
    main()
