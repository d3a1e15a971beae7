# Seed 001 (shared/seeds/001_*.txt): a linear 784->10 model on MNIST with DDP and a
# DistributedSampler, as the article writes it. Changed only where it names an NPU;
# each change is marked "chorus:". Two additions, also marked: the data set is
# Fashion-MNIST unless SEED001_DATASET=mnist (Debian packages Fashion-MNIST only; give
# MNIST's files to examples/seeds/run.sh --mnist DIR), and the article's script never
# calls train(), so a main block does.
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import torch_chorus  # chorus: registers the "chorus" backend (the article relies on torch_npu's hccl)


def init_distributed():
    # 获取当前节点的rank和总的节点数
    rank = int(os.getenv('RANK', 0))
    world_size = int(os.getenv('WORLD_SIZE', 1))

    # HCCL初始化
    dist.init_process_group(
        backend='chorus',  # chorus: was 'hccl'
        init_method='env://',
        rank=rank,
        world_size=world_size
    )

    # 设置当前进程使用的设备
    local_rank = int(os.getenv('LOCAL_RANK', 0))
    # chorus: was torch.npu.set_device(f'npu:{local_rank}'); a CPU has no device to select.

    return rank, world_size, local_rank


import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


class SimpleModel(nn.Module):
    def __init__(self):
        super(SimpleModel, self).__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)


def train(rank, world_size, local_rank):
    # 初始化分布式环境
    init_distributed()

    # 定义模型并移动到对应的设备
    model = SimpleModel().to('cpu')  # chorus: was .to(f'npu:{local_rank}')
    model = DDP(model)  # chorus: was device_ids=[local_rank]

    # 定义损失函数和优化器
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    # 准备数据
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
    # chorus: added the choice; the article has datasets.MNIST.
    Dataset = datasets.MNIST if os.getenv("SEED001_DATASET", "fashion") == "mnist" else datasets.FashionMNIST
    train_dataset = Dataset('./data', train=True, download=True, transform=transform)

    # 使用DistributedSampler实现数据并行
    train_sampler = DistributedSampler(train_dataset, num_replicas=world_size, rank=rank)
    train_loader = DataLoader(train_dataset, batch_size=32, sampler=train_sampler)

    # 训练循环
    for epoch in range(10):
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to('cpu'), target.to('cpu')  # chorus: was f'npu:{local_rank}'
            data = data.view(data.size(0), -1)

            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()

            if batch_idx % 100 == 0 and rank == 0:
                print(f'Epoch: {epoch} | Batch: {batch_idx} | Loss: {loss.item()}')

    # 清理分布式环境
    dist.destroy_process_group()


if __name__ == "__main__":  # chorus: added; the article's script defines train() only
    train(int(os.getenv('RANK', 0)), int(os.getenv('WORLD_SIZE', 1)), int(os.getenv('LOCAL_RANK', 0)))
