#!/usr/bin/env python3
"""Peer for bench/ddp/shard.sh: PyTorch's DistributedDataParallel over Gloo on CPU with AdamW,
whole on every rank (--optimizer adamw) or sharded by torch.distributed.optim.
ZeroRedundancyOptimizer (--optimizer zero: ZeRO stage 1, the optimizer state split over the
ranks, the parameters broadcast back after each step). The model is partrain's CIFAR ResNet-18
(trainer/model/models.cpp: 3x3 stem, two basic blocks per stage of widths c, 2c, 4c, 8c, 1x1
projection shortcuts, BatchNorm), trained on random 3x32x32 images of 100 classes, the same
size of batch per rank and number of steps as partrain's runs.

Each rank prints one line `# rank R: {json}` with its peak resident memory (getrusage, MiB),
its images/s over the steps after --warmup (its own wall clock, a barrier before each clock
read), the parameter count and the bytes of its optimizer state; rank 0 prints `# summary`.

  /usr/bin/python3 -m torch.distributed.run --nproc_per_node=2 zero_peer.py --optimizer zero
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


def resnet18(c, classes=100):
    layers = [nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
    cin = c
    for stage, width in enumerate([c, 2 * c, 4 * c, 8 * c]):
        for block in range(2):
            layers.append(BasicBlock(cin, width, 2 if stage > 0 and block == 0 else 1))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def state_bytes(optimizer):
    opt = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if torch.is_tensor(t))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--optimizer', choices=['adamw', 'zero'], default='adamw')
    p.add_argument('--width', type=int, default=128)
    p.add_argument('--batch-size', type=int, default=4, help='per rank')
    p.add_argument('--steps', type=int, default=16)
    p.add_argument('--warmup', type=int, default=4)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--lr', type=float, default=0.001)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--local_rank', '--local-rank', type=int, default=0, help='set by the launcher')
    args = p.parse_args()
    if not 0 <= args.warmup < args.steps:
        p.error(f'--steps ({args.steps}) must be more than --warmup ({args.warmup}): '
                'the rate is measured over the steps after the warm-up')

    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    torch.set_num_threads(args.threads)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = DDP(resnet18(args.width))
    params = sum(p.numel() for p in model.parameters())
    if args.optimizer == 'zero':
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                            lr=args.lr, weight_decay=0.01)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + rank)
    start = None
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        x = torch.randn(args.batch_size, 3, 32, 32, generator=gen)
        y = torch.randint(0, 100, (args.batch_size,), generator=gen)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    images = (args.steps - args.warmup) * args.batch_size * world
    mine = {'rank': rank, 'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            'images_per_s': images / seconds, 'parameters': params,
            'optimizer_state_mb': state_bytes(optimizer) / 2**20, 'loss': loss.item()}
    print(f'# rank {rank}: {json.dumps(mine)}', flush=True)
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        print('# summary ' + json.dumps({'optimizer': args.optimizer, 'world': world,
                                         'ranks': gathered}), flush=True)
    dist.barrier()


if __name__ == '__main__':
    main()
    # As ddp_peer.py: torch 1.13's Gloo teardown can deadlock at interpreter exit (a rank hung
    # there in this benchmark), and everything is printed and synchronised by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
