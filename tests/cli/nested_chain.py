"""A model nested DEPTH deep: a chain of modules, each calling the next inside its own
forward, trained for a few steps. ``--limit N`` sets the recursion limit first, as
scripts with deep models do; ``--deepest`` prints the deepest chain that trains here,
under the current limit. Usage: nested_chain.py DEPTH [--steps N] [--limit N]
| nested_chain.py --deepest"""

import argparse
import sys

import torch
from torch import nn


class Link(nn.Module):
    """A layer, then the rest of the chain."""

    def __init__(self, inner: nn.Module | None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        return x if self.inner is None else self.inner(x)


def chain(depth: int) -> nn.Module:
    """Built from the innermost out: building it recursively would recurse too."""
    model = None
    for _ in range(depth):
        model = Link(model)
    assert model is not None
    return model


def train(depth: int, steps: int) -> None:
    torch.manual_seed(0)
    model = chain(depth)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(2, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def deepest() -> int:
    low, high = 1, sys.getrecursionlimit() // 3  # a nested call takes 3 frames at least
    while low < high:
        mid = (low + high + 1) // 2
        try:
            train(mid, 1)
        except RecursionError:
            high = mid - 1
        else:
            low = mid
    return low


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("depth", type=int, nargs="?", default=0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--deepest", action="store_true")
    args = parser.parse_args()
    if args.limit:
        sys.setrecursionlimit(args.limit)
    if args.deepest:
        print(deepest())
        return
    train(args.depth, args.steps)
    print(f"trained a chain {args.depth} deep")


if __name__ == "__main__":
    main()
