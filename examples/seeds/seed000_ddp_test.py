# Seed 000 (shared/seeds/000_*.txt, "ddp_test.py"): the MLP 784-512-512-10 on
# Fashion-MNIST with DDP, as the article writes it. Changed only where it names an NPU;
# each change is marked "chorus:" with what it was.
#
#   build/bin/chorusrun --nproc-per-node 2 /usr/bin/python3 seed000_ddp_test.py
#
# (examples/seeds/run.sh prepares ./data from Debian's dataset-fashion-mnist and runs it.)

# 导入依赖和库
import torch
from torch import nn
import torch_chorus  # chorus: was `import torch_npu`; registers the "chorus" backend
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import ToTensor
import time
import torch.multiprocessing as mp
import os

torch.manual_seed(0)

# 下载训练数据集
training_data = datasets.FashionMNIST(
    root="./data",
    train=True,
    download=True,
    transform=ToTensor(),
)

# 下载测试数据集
test_data = datasets.FashionMNIST(
    root="./data",
    train=False,
    download=True,
    transform=ToTensor(),
)


# 构建模型
class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28*28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10)
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def test(dataloader, model, loss_fn):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    print(f"Test Error: \n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \n")


def main(world_size: int, batch_size, args):  # 使用python拉起命令中设置的超参数
    ngpus_per_node = world_size
    args.gpu = args.local_rank  # 任务拉起后，lacal_rank自动获取的device号
    main_worker(args.gpu, ngpus_per_node, args)


def ddp_setup(rank, world_size):
    """
    Args:
        rank: Unique identifier of each process
        world_size: Total number of processes
    """
    dist.init_process_group(backend="chorus", rank=rank, world_size=world_size)  # chorus: was backend="hccl"


def main_worker(gpu, ngpus_per_node, args):
    start_epoch = 0
    end_epoch = 5
    args.gpu = args.local_rank  # 任务拉起后，local_rank自动获得device号
    # chorus: was ddp_setup(args.gpu, ...): the NPU's number is the rank only on one node.
    ddp_setup(int(os.environ["RANK"]), args.world_size)
    # chorus: was torch_npu.npu.set_device(args.gpu); a CPU has no device to select.
    total_batch_size = args.batch_size
    total_workers = ngpus_per_node
    batch_size = int(total_batch_size / ngpus_per_node)
    workers = int((total_workers + ngpus_per_node - 1) / ngpus_per_node)
    model = NeuralNetwork()
    device = torch.device("cpu")  # chorus: was torch.device("npu")
    train_sampler = torch.utils.data.distributed.DistributedSampler(training_data)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_data)
    train_loader = torch.utils.data.DataLoader(
        training_data, batch_size=batch_size, shuffle=(train_sampler is None),
        num_workers=workers, pin_memory=False, sampler=train_sampler, drop_last=True)
    val_loader = torch.utils.data.DataLoader(
        test_data, batch_size=batch_size, shuffle=(test_sampler is None),
        num_workers=workers, pin_memory=False, sampler=test_sampler, drop_last=True)
    loc = 'cpu'  # chorus: was 'npu:{}'.format(args.gpu)
    model = model.to(loc)
    criterion = nn.CrossEntropyLoss().to(loc)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model = torch.nn.parallel.DistributedDataParallel(model)  # chorus: was device_ids=[args.gpu]
    for epoch in range(start_epoch, end_epoch):
        print("curr epoch: ", epoch)
        train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args.gpu)


def train(train_loader, model, criterion, optimizer, epoch, gpu):
    size = len(train_loader.dataset)
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        # measure data loading time
        loc = 'cpu'  # chorus: was 'npu:{}'.format(gpu)
        # chorus: was target.to(torch.int32), which NPU kernels take; CPU ones take int64.
        images, target = images.to(loc, non_blocking=False), target.to(loc, non_blocking=False)
        # compute output
        output = model(images)
        loss = criterion(output, target)
        # compute gradient and do SGD step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        end = time.time()
        if i % 100 == 0:
            loss, current = loss.item(), i * len(target)
            print(f"loss: {loss:>7f} [{current:>5d}/{size:>5d}]")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('--batch_size', default=512, type=int, help='Input batch size on each device (default: 32)')
    parser.add_argument('--gpu', default=None, type=int,
                        help='GPU id to use.')
    parser.add_argument("--local_rank", default=-1, type=int)
    args = parser.parse_args()
    args.local_rank = int(os.environ['LOCAL_RANK'])  # 获取环境中的local_rank变量作为指定的device
    world_size = int(os.environ["WORLD_SIZE"])  # chorus: was torch.npu.device_count()
    args.world_size = world_size
    main(args.world_size, args.batch_size, args)  # 将python拉起命令中设置参数传入main函数
