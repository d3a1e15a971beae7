#!/usr/bin/python3
"""One DDP training step of seed 000's model from Python, data already in memory: the
DDP column of bench/compare_torch_backends.sh.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and
build/python on PYTHONPATH for --backend chorus). Fashion-MNIST's training images are
read once into one tensor (from DIR/FashionMNIST/raw, as torchvision lays it out);
each step takes the rank's next slice of a global batch (--batch, split over the
ranks), runs forward, backward (DDP allreduces the gradients) and SGD. -w steps warm
up, -n are timed; rank 0 prints "samples_per_s S loss L" with the slowest rank's time.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torchvision import datasets
from torchvision.transforms import ToTensor

from pytorch_ddp_mnist import NeuralNetwork  # seed 000's model (this folder)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["gloo", "chorus"], required=True)
    p.add_argument("--data", required=True, help="folder holding FashionMNIST/raw")
    p.add_argument("--batch", type=int, default=512, help="global batch")
    p.add_argument("-n", "--steps", type=int, default=60)
    p.add_argument("-w", "--warmup", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.backend == "chorus":
        import torch_chorus  # noqa: F401
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    train = datasets.FashionMNIST(args.data, train=True, download=False, transform=ToTensor())
    images = train.data.float().div_(255).unsqueeze(1)  # what ToTensor gives, all at once
    labels = train.targets
    per_rank = args.batch // world
    torch.manual_seed(0)
    model = DDP(NeuralNetwork())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    batches = images.shape[0] // args.batch

    def step(i):
        start = (i % batches) * args.batch + rank * per_rank
        x, y = images[start:start + per_rank], labels[start:start + per_rank]
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("samples_per_s %.1f loss %.6f" % (args.steps * per_rank * world / elapsed.item(),
                                                 loss.item()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
