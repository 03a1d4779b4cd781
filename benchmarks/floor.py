"""What `--level stats` costs against the floor of what it does: one read of every tensor.

At stats hookdbg reads every tensor it summarises once (``_cstats.c``: min, max, sum,
sum of squares, counts, in one pass) and every parameter's norm after the optimizer
step. No hook can do less. This measures that floor in the same process run, beside
the unrecorded step and hookdbg's levels, and reports hookdbg's extra time as a multiple
of it, per model.

The floor's tensors are exactly those hookdbg reads: one recorded step (the Python per
call path, which reads what the C path reads: the parity tests hold them to it) notes
every tensor handed to the statistics pass and to the norms, and keeps a copy of each.
The floor is then the unrecorded step plus the same C passes over those copies, with no
hooks, no rows, no writer, timed on their own (a difference of two steps' times would
drown it in the steps' noise). hookdbg reads a tensor right after the op that made it,
often from cache; the copies, read in turn after the step, come from memory. So the
floor is each copy read right after a first read of it (warm), and the all-in-turn
reading is shown beside it (cold): the floor is strict, the cold one an upper bound.

Figures are CPU time of all threads of this process (the writer's included), medians
over interleaved rounds (``overhead.measure``: each round opens a recorder, warms up,
times steady steps between two flushes).

    python benchmarks/floor.py                 # four models, a few minutes
    python benchmarks/floor.py --only gpt --rounds 9

Targets (#47): stats extra <= 1.5x the floor's on every model; stats <= 1.10x the
unrecorded step on resnet18, <= 1.15x on the GPT; timing <= 1.03x; idle <= 1.01x.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import overhead
import torch
from overhead import Costs, Step, hookdbg_at, hookdbg_idle, measure
from torch import nn
from torch.nn import functional as F

from hookdbg.recorder import record
from hookdbg.recorder.accelerated import PURE_PYTHON
from hookdbg.recorder.summaries import stats

# -- the models ----------------------------------------------------------------------


def mobilenet() -> tuple[Step, int]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    criterion = nn.CrossEntropyLoss()
    return overhead._train_step(model, opt, x, lambda out: criterion(out, y))


class Block(nn.Module):
    """A pre-norm GPT block, written as people write them (nanoGPT's shape)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.gelu, self.out = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(self.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, 4) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt() -> tuple[Step, int]:
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(0, 512, (8, 64))
    targets = torch.randint(0, 512, (8, 64))
    return overhead._train_step(
        model, opt, idx, lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    )


class WordLM(nn.Module):
    """pytorch/examples' word language model, small: embedding, 2-layer LSTM, decoder."""

    def __init__(self, vocab: int = 1000, d: int = 200) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.encoder(idx))
        return self.decoder(out)


def lstm() -> tuple[Step, int]:
    torch.manual_seed(0)
    model = WordLM()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    idx, targets = torch.randint(0, 1000, (20, 35)), torch.randint(0, 1000, (20, 35))
    return overhead._train_step(
        model, opt, idx, lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    )


MODELS: dict[str, tuple[Callable[[], tuple[Step, int]], int, int]] = {
    # name: (make, steps timed, warm-up steps): about a second timed per round
    "resnet18": (overhead.resnet18, 6, 4),
    "mobilenet_v3_small": (mobilenet, 16, 4),
    "gpt": (gpt, 24, 4),
    "lstm": (lstm, 24, 4),
}

# -- what hookdbg reads in a step -----------------------------------------------------


class Reads:
    """The tensors hookdbg's statistics pass and norms read in one step (copies), and
    that same reading done again with no hooks around it."""

    def __init__(self) -> None:
        self.summarised: list[torch.Tensor] = []
        self.normed: list[list[torch.Tensor]] = []

    @property
    def elements(self) -> int:
        return sum(t.numel() for t in self.summarised) + sum(
            t.numel() for ts in self.normed for t in ts
        )

    def read(self) -> None:
        """The floor: hookdbg's own C passes over exactly the step's tensors."""
        for t in self.summarised:
            summarise(t)
        for tensors in self.normed:
            norms_of(tensors)


summarise, norms_of = stats.summarise, stats.norms_of


@contextlib.contextmanager
def noting(reads: Reads) -> Iterator[None]:
    """While it is open, every tensor hookdbg summarises or takes the norm of is noted."""

    def noted_summarise(t: torch.Tensor) -> stats.Summary:
        reads.summarised.append(stats.local(t).detach().clone())
        return summarise(t)

    def noted_norms(tensors: list[torch.Tensor]) -> list[float]:
        reads.normed.append([stats.local(t).detach().clone() for t in tensors])
        return norms_of(tensors)

    stats.summarise, stats.norms_of = noted_summarise, noted_norms  # type: ignore[assignment]
    try:
        yield
    finally:
        stats.summarise, stats.norms_of = summarise, norms_of  # type: ignore[assignment]


def reads_of(step: Step, warmup: int, workdir: Path) -> Reads:
    """Record ``warmup`` steps and one more at stats, noting what that last one reads."""
    reads = Reads()
    before = os.environ.get(PURE_PYTHON)
    os.environ[PURE_PYTHON] = "1"
    try:
        # noting first: a recorder takes its summary function when it opens
        with noting(reads), record(workdir / "reads.h5", force=True, quiet=True) as rec:
            for _ in range(warmup):
                step()
            rec.flush()
            reads.summarised.clear()
            reads.normed.clear()
            step()
            rec.flush()  # the step's backward rows come as it ends
            kept = Reads()  # as of now: what the close may read is not the step's
            kept.summarised, kept.normed = list(reads.summarised), list(reads.normed)
    finally:
        if before is None:
            del os.environ[PURE_PYTHON]
        else:
            os.environ[PURE_PYTHON] = before
    return kept


# -- the comparison -------------------------------------------------------------------

CONFIGS: dict[str, overhead.Context] = {
    "timing": hookdbg_at("timing"),
    "stats": hookdbg_at("stats"),
    "idle": hookdbg_idle,
}


def floor_times(reads: Reads, rounds: int) -> tuple[float, float]:
    """CPU seconds of one reading of the step's tensors, (warm, cold): each tensor read
    right after a first read of it (from cache where it fits, as hookdbg finds a tensor
    just made), and all of them read in turn (from memory). Medians of ``rounds``; the
    pass is deterministic, a step is not, hence timed on its own."""
    clock = time.process_time

    def warm() -> float:
        spent = 0.0
        for t in reads.summarised:
            summarise(t)
            t0 = clock()
            summarise(t)
            spent += clock() - t0
        for tensors in reads.normed:
            norms_of(tensors)
            t0 = clock()
            norms_of(tensors)
            spent += clock() - t0
        return spent

    def cold() -> float:
        t0 = clock()
        reads.read()
        return clock() - t0

    reads.read()  # the copies paged in, the kernels' first-call work done
    return (
        statistics.median(warm() for _ in range(rounds)),
        statistics.median(cold() for _ in range(rounds)),
    )


def compare(name: str, rounds: int) -> dict[str, float]:
    make, steps, warmup = MODELS[name]
    step, calls = make()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        reads = reads_of(step, warmup, workdir)
        runs: dict[str, list[Costs]] = {k: [] for k in ("unrecorded", *CONFIGS)}
        for r in range(rounds):
            runs["unrecorded"].append(measure(step, None, warmup, steps, workdir))
            for config, context in CONFIGS.items():
                runs[config].append(measure(step, context, warmup, steps, workdir))
            print(f"  {name}: round {r + 1}/{rounds}", end="\r", file=sys.stderr)
    cpu = {k: statistics.median(c.per_step[1] for c in v) for k, v in runs.items()}
    base = cpu["unrecorded"]
    floor_extra, cold_extra = floor_times(reads, rounds)
    cpu["floor"], cpu["floor, cold"] = base + floor_extra, base + cold_extra
    tensors = len(reads.summarised) + sum(len(ts) for ts in reads.normed)
    print(
        f"\n{name}: {calls} module calls, {tensors} tensors read ({reads.elements / 1e6:.2f}M "
        f"values) per step; unrecorded {base * 1e3:.2f} ms CPU (median of {rounds} rounds "
        f"of {steps} steps)"
    )
    print(
        f"  {'':12s} {'ms/step':>9s} {'x unrec':>8s} {'extra ms':>9s} {'x floor':>8s}"
        f" {'us/call':>8s}"
    )
    for config in ("floor", "floor, cold", *CONFIGS):
        extra = cpu[config] - base
        multiple = extra / floor_extra if floor_extra > 0 else math.nan
        print(
            f"  {config:12s} {cpu[config] * 1e3:9.2f} {cpu[config] / base:8.3f} "
            f"{extra * 1e3:+9.2f} {multiple:8.2f} {extra / calls * 1e6:+8.1f}"
        )
    return {k: v / base for k, v in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(MODELS), action="append", help="one model")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kept = overhead.keep_freed_memory()
    print(
        f"torch {torch.__version__} on CPU, {args.threads} thread(s), {args.rounds} rounds"
        + (", freed memory kept (glibc)" if kept else "")
    )
    for name in args.only or MODELS:
        compare(name, args.rounds)


if __name__ == "__main__":
    main()
