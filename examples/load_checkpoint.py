"""Loads a partrain checkpoint of a DigitalNet back into the Python module, strictly.

    /usr/bin/python3 examples/load_checkpoint.py runs/torchscript_fashion_mnist/checkpoints/epoch-0002.pt \
        --in-channels 1 --num-classes 10 --width 16

The checkpoint's "model" entry is a state dict under the module's own names; it must load
with strict=True and every tensor must have the dtype and shape the module holds (int64 for
BatchNorm's num_batches_tracked). --initial names the state_dict save_digitalnet.py wrote:
then every parameter must have moved from it (the checkpoint holds trained values).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digitalnet import DigitalNet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--in-channels", type=int, default=3)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--norm", choices=["batch", "none"], default="batch")
    parser.add_argument("--initial", help="the state_dict the run started from")
    args = parser.parse_args()

    model = DigitalNet(args.in_channels, args.num_classes, args.width, args.norm == "batch")
    expected = model.state_dict()
    state = torch.load(args.checkpoint, map_location="cpu")["model"]
    for name, tensor in state.items():
        if name in expected:
            want = expected[name]
            if tensor.dtype != want.dtype or tensor.shape != want.shape:
                sys.exit(f"{name}: {tensor.dtype} {tuple(tensor.shape)} in the checkpoint, "
                         f"the module holds {want.dtype} {tuple(want.shape)}")
    model.load_state_dict(state, strict=True)
    if args.initial:
        initial = torch.load(args.initial)
        for name, p in model.named_parameters():
            if torch.equal(p.detach(), initial[name]):
                sys.exit(f"{name} is still its initial value")
    counted = state.get("bn1.num_batches_tracked")
    print(f"loaded {len(state)} tensors into DigitalNet, strict"
          + (f"; bn1.num_batches_tracked = {int(counted)}" if counted is not None else ""))


if __name__ == "__main__":
    main()
