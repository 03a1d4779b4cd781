"""NumNet: a small MLP that learns to tell ten noisy 8x8 digit patterns apart.

The smallest real training loop: runs in about a second on a laptop CPU. With
``--eval-every N`` it also validates every N steps, as most training scripts do (hookdbg
records those forward-only batches as eval batches, apart from the steps).

    hookdbg record -o numnet.h5 samples/numnet_mlp.py --steps 20 --eval-every 10
"""

import argparse

import torch
from torch import nn


class NumNet(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def batches(steps: int, batch: int, seed: int):
    """Ten fixed random 8x8 patterns, shown with noise; the label is the pattern."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.rand(10, 8, 8, generator=g)
    for _ in range(steps):
        y = torch.randint(0, 10, (batch,), generator=g)
        x = patterns[y] + 0.3 * torch.randn(batch, 8, 8, generator=g)
        yield x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=0, metavar="N")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = NumNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(batches(args.steps, args.batch, args.seed)):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")
        if args.eval_every and (step + 1) % args.eval_every == 0:
            print(f"step {step:3d}  validation accuracy {validate(model, args):.0%}")


def validate(model: nn.Module, args: argparse.Namespace) -> float:
    """Two held-out batches, the way validation loops run: eval mode, no gradients."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in batches(2, args.batch, args.seed + 1):
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return right / total


if __name__ == "__main__":
    main()
