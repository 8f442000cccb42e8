"""PyTorch's own Python training loop of DigitalNet on one GPU: the peer partrain's GPU
epoch time is compared with (scripts/gpu-check.sh). Same model (the built-in DigitalNet,
width 64, BatchNorm), data (a CIFAR-100 binary directory), batch, optimizer (SGD 0.05,
momentum 0.9, weight decay 5e-4), host-side batches copied to the device each step.

Also measures the device's fp32 matmul rate and the model's FLOPs per training image, for
the roofline floor of an epoch: FLOPs x images / matmul rate.
"""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN = (0.5071, 0.4865, 0.4409)
STD = (0.2673, 0.2564, 0.2762)


def digitalnet(c, classes=100):
    def unit(i, o):
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
    return nn.Sequential(*unit(3, c), nn.MaxPool2d(2), *unit(c, 2 * c), nn.MaxPool2d(2),
                         *unit(2 * c, 4 * c), nn.MaxPool2d(2), *unit(4 * c, 8 * c),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * c, classes))


def read_cifar(path):
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3074)
    return torch.from_numpy(raw[:, 2:].reshape(-1, 3, 32, 32).copy()), torch.from_numpy(raw[:, 1].astype(np.int64))


def training_flops_per_image(c, size=32):
    """Multiply-adds x 2 of the forward convolutions and linear layer, x 3 for forward + the
    two backward products (input and weight gradients)."""
    flops, s, cin = 0, size, 3
    for i, cout in enumerate((c, 2 * c, 4 * c, 8 * c)):
        flops += 2 * cin * cout * 9 * s * s
        cin = cout
        if i < 3:
            s //= 2
    flops += 2 * 8 * c * 100
    return 3 * flops


def matmul_rate(device, n=8192, reps=20):
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    x, y = read_cifar(f"{a.data}/train.bin")
    mean = torch.tensor(MEAN).view(1, 3, 1, 1).to(device)
    std = torch.tensor(STD).view(1, 3, 1, 1).to(device)
    model = digitalnet(a.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    torch.cuda.reset_peak_memory_stats(device)
    epochs = []
    for epoch in range(a.epochs):
        perm = torch.randperm(len(x))
        torch.cuda.synchronize()
        t = time.perf_counter()
        for k in range(0, len(x), a.batch_size):
            idx = perm[k:k + a.batch_size]
            xb = x[idx].to(device, non_blocking=True).float().div_(255).sub_(mean).div_(std)
            yb = y[idx].to(device, non_blocking=True)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        sec = time.perf_counter() - t
        epochs.append({"epoch": epoch + 1, "seconds": sec, "images_per_s": len(x) / sec, "loss": loss.item()})
        print(f"epoch {epoch + 1}: {sec:.2f} s, {len(x) / sec:.0f} img/s, loss {loss.item():.3f}", flush=True)
    rate = matmul_rate(device)
    flops = training_flops_per_image(a.width)
    result = {
        "batch_size": a.batch_size, "images": len(x), "epochs": epochs,
        "peak_allocated_mb": torch.cuda.max_memory_allocated(device) / 2 ** 20,
        "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2 ** 20,
        "matmul_fp32_tflops": rate / 1e12, "training_gflops_per_image": flops / 1e9,
        "roofline_epoch_seconds": flops * len(x) / rate,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(device),
    }
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
