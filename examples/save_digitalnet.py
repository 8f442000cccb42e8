"""Saves DigitalNet (digitalnet.py) as TorchScript for `model: {torchscript: FILE}`.

    /usr/bin/python3 examples/save_digitalnet.py --out digitalnet.pt \
        --in-channels 1 --num-classes 10 --width 16

--trace saves torch.jit.trace's graph instead of torch.jit.script's. A trace records one
run, in the mode the module was in: traced in training mode, BatchNorm normalises with the
batch's statistics in evaluation too. Script the modules that hold BatchNorm or Dropout.
--state-dict also writes the freshly initialised module's state_dict (torch.save), the
starting point of the run, for comparing a checkpoint against.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digitalnet import DigitalNet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the TorchScript file to write")
    parser.add_argument("--in-channels", type=int, default=3)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--norm", choices=["batch", "none"], default="batch")
    parser.add_argument("--image-size", type=int, default=32, help="for --trace's example input")
    parser.add_argument("--trace", action="store_true", help="torch.jit.trace, not script")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--state-dict", help="also torch.save the initial state_dict here")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = DigitalNet(args.in_channels, args.num_classes, args.width, args.norm == "batch")
    if args.trace:
        example = torch.randn(2, args.in_channels, args.image_size, args.image_size)
        saved = torch.jit.trace(model, example)
    else:
        saved = torch.jit.script(model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    saved.save(tmp)
    os.replace(tmp, args.out)
    if args.state_dict:
        torch.save(model.state_dict(), args.state_dict)
    print(f"saved {'traced' if args.trace else 'scripted'} DigitalNet(in_channels="
          f"{args.in_channels}, num_classes={args.num_classes}, width={args.width}, "
          f"norm={args.norm}) to {args.out}")


if __name__ == "__main__":
    main()
