"""torchvision's resnet18 (in-place ReLUs and all) trained on FakeData: no downloads.

hookdbg record -o resnet.h5 samples/resnet_fakedata.py --steps 5
"""

import argparse

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = torchvision.datasets.FakeData(
        size=args.steps * args.batch,
        image_size=(3, args.size, args.size),
        num_classes=10,
        transform=torchvision.transforms.ToTensor(),
        random_offset=args.seed,
    )
    loader = DataLoader(data, batch_size=args.batch, shuffle=False)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    model.train()
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
