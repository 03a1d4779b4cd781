"""Mixed precision with a GradScaler, the way AMP is meant to be used, on CPU.

The scaler starts with a loss scale far too large (``--init-scale``), so the scaled
gradients of the first steps overflow to inf; the scaler skips those optimizer steps
and halves the scale until the gradients fit, then training goes on. That is AMP
working: hookdbg records the skipped steps and raises no alert.

``--nan-grad``: the model's ``length`` computes sqrt(sum(x^2)) of a row of zeros every
step, so its backward makes NaN at *any* scale. The scaler keeps skipping and halving;
once the scale is down to 1 the gradient is non-finite even unscaled, and hookdbg names
where it is born.

    hookdbg record -o amp.h5 samples/amp_scaler.py && hookdbg summary amp.h5
    hookdbg record -o nan.h5 samples/amp_scaler.py --nan-grad --init-scale 8
"""

import argparse

import torch
from torch import nn


class Length(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt((x * x).sum(-1, keepdim=True))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
        self.length = Length()
        self.head = nn.Linear(17, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.head(torch.cat([h, self.length(h)], dim=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--init-scale", type=float, default=2.0**127)
    parser.add_argument("--nan-grad", action="store_true", help="a NaN gradient every step")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    if args.nan_grad:
        x[0] = 0.0
        with torch.no_grad():
            model.body[2].bias.zero_()
            model.body[0].bias.zero_()
    for step in range(args.steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y) * 100
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"step {step}: loss {loss.item():.4f}, scale {scaler.get_scale():g}")


if __name__ == "__main__":
    main()
