"""A half-precision model whose activations climb until they overflow float16.

The first Linear's weights grow 4x a step (a learning-rate bug, written out by hand), so
its output's largest magnitude climbs 4x a step until it passes float16's largest
finite value (65504) and becomes inf, in the forward pass; the next Linear turns it into
NaN. ``hookdbg alerts`` shows the run-up: the climb, step by step, as a share of
float16's range.

    hookdbg record -o fp16.h5 samples/fp16_overflow.py
    hookdbg alerts fp16.h5
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--growth", type=float, default=4.0, help="the weights' factor a step")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).half()
    x = torch.randn(8, 16).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for step in range(args.steps):
        loss = model(x).float().mean() * 1e-3  # small gradients: the forward overflows first
        loss.backward()
        opt.step()
        with torch.no_grad():
            model[0].weight.mul_(args.growth)
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
