"""A tiny LightningModule and its data, shared by the in-process tests and the
2-process DDP script."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitNet(L.LightningModule):
    """Puts a NaN into its batch at global step ``nan_at`` (on rank ``nan_rank``), or
    raises there with ``fail_at``."""

    def __init__(self, nan_at: int = -1, nan_rank: int = 0, fail_at: int = -1) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
        self.nan_at, self.nan_rank, self.fail_at = nan_at, nan_rank, fail_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_step == self.fail_at:
            raise RuntimeError("the data loader broke")
        if self.global_step == self.nan_at and self.global_rank == self.nan_rank:
            x = x.clone()
            x[0, 0, 0] = float("nan")
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 4, 4, generator=g), torch.randint(0, 2, (96,), generator=g)
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8)
    return train, DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)


def trainer(callback: L.Callback, accum: int = 1, **kwargs) -> L.Trainer:
    """6 steps, validation every 3 batches (2 batches), sanity check first (2 batches)."""
    options = {
        "max_steps": 6,
        "limit_val_batches": 2,
        "val_check_interval": 3,
        "accumulate_grad_batches": accum,
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [callback],
        **kwargs,
    }
    return L.Trainer(**options)
