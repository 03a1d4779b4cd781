"""A training run that goes NaN at a known step, in forward or in backward.

* ``--where forward`` (default): ``model.standardize`` divides by the per-row std
  without an epsilon; at ``--nan-step`` one input row is constant, so 0/0 = NaN is
  born in that module's forward.
* ``--where backward``: ``model.length`` computes a vector norm as sqrt(sum(x^2)); at
  ``--nan-step`` one row of its input is masked to zeros. The forward value is a finite 0,
  but the gradient of sqrt at 0 is infinite, so NaN is born in that module's backward.

    hookdbg record -o nan.h5 samples/nan_blowup.py --nan-step 3
    hookdbg record --on-nan stop samples/nan_blowup.py --where backward
"""

import argparse

import torch
from torch import nn


class Standardize(nn.Module):
    """(x - mean) / std per row: the classic missing epsilon."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)


class Length(nn.Module):
    """Euclidean length of each row, written out by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((x * x).sum(-1, keepdim=True))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.standardize = Standardize()
        self.proj = nn.Linear(16, 16)
        self.length = Length()
        self.head = nn.Linear(17, 1)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.standardize(x)) * keep  # keep: 1 per row, 0 drops the row
        return self.head(torch.cat([h, self.length(h)], dim=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nan-step", type=int, default=3)
    parser.add_argument("--where", choices=["forward", "backward"], default="forward")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(8, 16)
        y = torch.randn(8, 1)
        keep = torch.ones(8, 1)
        if step == args.nan_step and args.where == "forward":
            x[0] = 1.0  # a constant row: its std is 0
        if step == args.nan_step and args.where == "backward":
            keep[0] = 0.0  # a zero row into model.length
        loss = ((model(x, keep) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
