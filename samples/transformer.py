"""A small transformer encoder that learns to spot a token in padded sequences.

Exercises keyword arguments (src_key_padding_mask), nested attention modules and
modules called several times per step.

    hookdbg record -o transformer.h5 samples/transformer.py --steps 10
"""

import argparse

import torch
from torch import nn

VOCAB, MAXLEN, TARGET = 32, 24, 7


class Spotter(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.position = nn.Parameter(torch.randn(MAXLEN, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=2 * dim, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        h = self.encoder(h, src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


def batch(size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = torch.randint(4, MAXLEN + 1, (size,), generator=g)
    tokens = torch.randint(1, VOCAB, (size, MAXLEN), generator=g)
    pad_mask = torch.arange(MAXLEN) >= lengths.unsqueeze(1)
    tokens[pad_mask] = 0
    labels = ((tokens == TARGET).any(1)).long()
    return tokens, pad_mask, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    model = Spotter()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    for step in range(args.steps):
        tokens, pad_mask, labels = batch(args.batch, g)
        optimizer.zero_grad()
        loss = criterion(model(tokens, pad_mask), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
