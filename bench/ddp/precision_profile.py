"""Where bf16 autocast's time goes on the CPU: one DigitalNet training step (width 16, 1x28x28
inputs, batch 128, 10 classes: configs/fashion_mnist.yaml's shapes, one thread) under f32 and
under bf16 autocast, timed, then profiled op by op with torch.profiler.

Debian's python3-torch is the same LibTorch build that partrain links, so the kernels it picks
are those partrain's ranks run. Usage: /usr/bin/python3 bench/ddp/precision_profile.py [STEPS]
"""

import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from digitalnet import DigitalNet  # noqa: E402

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
torch.manual_seed(0)
torch.set_num_threads(1)
model = DigitalNet(in_channels=1, num_classes=10, width=16)
images = torch.randn(128, 1, 28, 28)
labels = torch.randint(0, 10, (128,))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def step(bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


capability = [line.strip() for line in torch.__config__.show().splitlines() if "CPU capability" in line]
print(f"torch {torch.__version__}; {' '.join(capability)}")
cpu_flags = open("/proc/cpuinfo").read().split()
print("avx512bw/vl/dq:", all(f in cpu_flags for f in ("avx512bw", "avx512vl", "avx512dq")))
rate = {}
for name, bf16 in (("f32", False), ("bf16", True)):
    for _ in range(3):  # warm-up
        step(bf16)
    start = time.perf_counter()
    for _ in range(STEPS):
        step(bf16)
    seconds = (time.perf_counter() - start) / STEPS
    rate[name] = 128 / seconds
    print(f"\n{name}: {seconds * 1000:.1f} ms a step, {rate[name]:.0f} images/s")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step(bf16)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))
print(f"bf16 / f32 = {rate['bf16'] / rate['f32']:.2f}x")
