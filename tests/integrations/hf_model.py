"""A tiny Hugging Face model built from a config (no download) and its data, shared by
the in-process tests and the subprocess scripts."""

import torch
from torch.utils.data import Dataset, IterableDataset
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments


class Tokens(Dataset):
    """Token ids with padded attention masks."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(5, 60, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        mask = torch.ones(8, dtype=torch.long)
        mask[6 - i % 3 :] = 0  # padded
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": i % 2}


class Embedded(IterableDataset):
    """Embedded tokens in a fixed order: item ``nan_from`` and those after it hold a
    NaN; item ``fail_at`` raises."""

    def __init__(self, nan_from: int = 1 << 30, fail_at: int = 1 << 30) -> None:
        self.nan_from, self.fail_at = nan_from, fail_at

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for i in range(1 << 20):
            if i == self.fail_at:
                raise RuntimeError("the data loader broke")
            x = torch.randn(8, 16, generator=g)
            if i >= self.nan_from:
                x[0, 0] = float("nan")
            yield {
                "inputs_embeds": x,
                "attention_mask": torch.ones(8, dtype=torch.long),
                "labels": i % 2,
            }


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def arguments(out: str, accum: int = 1, **kwargs) -> TrainingArguments:
    """4 steps of 4 examples; with an eval dataset, evaluation every 2 steps."""
    options = {
        "output_dir": out,
        "max_steps": 4,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": accum,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        **kwargs,
    }
    return TrainingArguments(**options)
