"""How much slower training runs under hookdbg, next to the tools people compare it with.

Every configuration is measured interleaved with the unrecorded baseline in the same
process (rounds of: baseline, then each configuration in turn). A round opens the
recorder, runs a few warm-up steps, then times the workload's steps; a recorder is made
to write what it holds before and after them (``Recorder.flush``), so the timed steps
count what comes now and then (the writer thread, garbage collections) and the writing
of their own rows, and nothing that comes once. What comes once (the open, the first
calls of each module, the flight recorder filling, the close) is printed apart, in
milliseconds. The table compares the medians of the rounds, so a machine that is busy
for a while slows all configurations alike. Figures are CPU time (all threads of this
process), which does not count time the machine gave to other tenants. Wall time is
printed too: it waits for the writer's last rows, which it would otherwise write beside
training, so it is an upper bound. glibc is told to keep freed memory for the next step
in every configuration alike (``keep_freed_memory``; ``--glibc-defaults`` leaves it).

    python benchmarks/overhead.py            # tiny MLP + resnet18, a few minutes
    python benchmarks/overhead.py --quick    # fewer rounds (noisier)
    python benchmarks/overhead.py --only mlp
    python benchmarks/overhead.py --configs hookdbg   # hookdbg's configurations only
    python benchmarks/overhead.py --device cuda   # wall time is what counts there

Workloads (the issue's and docs/performance.md's):

* ``mlp``: 48 x (Linear(32, 32) + Tanh), batch 8: host-bound, every module call is
  pure overhead; reported in microseconds per module call above the unrecorded step.
* ``resnet18``: torchvision resnet18, 16 x 3 x 64 x 64: reported as a step-time ratio.
* ``resnet18-224`` (with ``--device cuda``): 64 x 3 x 224 x 224, a device-bound step.

Targets: timing <= 5 us and stats <= 12 us per tiny-module call; steps that --every
skips <= 2 us per call; resnet18 at stats <= 1.10x, at shapes <= 1.03x.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from hookdbg.recorder import Recorder, record

Step = Callable[[], None]
Context = Callable[[Path], contextlib.AbstractContextManager[object]]


DEVICE = torch.device("cpu")


def mlp() -> tuple[Step, int]:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(48) for m in (nn.Linear(32, 32), nn.Tanh())])
    model.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, device=DEVICE)
    return _train_step(model, opt, x, lambda out: out.pow(2).mean())


def resnet18(batch: int = 16, size: int = 64) -> tuple[Step, int]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=DEVICE)
    y = torch.randint(0, 10, (batch,), device=DEVICE)
    criterion = nn.CrossEntropyLoss()
    return _train_step(model, opt, x, lambda out: criterion(out, y))


def _train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss: Callable
) -> tuple[Step, int]:
    def step() -> None:
        opt.zero_grad()
        loss(model(x)).backward()
        opt.step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()  # each step's time includes its kernels

    calls: list[object] = []
    handle = module_hooks.register_module_forward_pre_hook(lambda m, a: calls.append(m))
    step()
    handle.remove()
    return step, len(calls)


# -- what is compared --------------------------------------------------------------------


def _hook_pair(pre: Callable, post: Callable) -> Iterator[None]:
    """A global forward pre-hook and forward hook, installed for the block."""
    a = module_hooks.register_module_forward_pre_hook(pre)
    b = module_hooks.register_module_forward_hook(post)
    try:
        yield
    finally:
        a.remove()
        b.remove()


@contextlib.contextmanager
def empty_hooks(_: Path) -> Iterator[None]:
    """The floor: a global forward pre-hook and forward hook that do nothing."""
    yield from _hook_pair(lambda m, args: None, lambda m, args, out: None)


@contextlib.contextmanager
def timing_hooks(_: Path) -> Iterator[None]:
    """The least a module timer does: a clock in the pre-hook, a difference after."""
    starts: dict[int, float] = {}
    times: list[float] = []
    clock = time.perf_counter

    def pre(m: nn.Module, args: object) -> None:
        starts[id(m)] = clock()

    def post(m: nn.Module, args: object, out: object) -> None:
        times.append(clock() - starts.pop(id(m), 0.0))

    yield from _hook_pair(pre, post)


@contextlib.contextmanager
def fwd_bwd_timing_hooks(_: Path) -> Iterator[None]:
    """The least a forward and backward module timer does with PyTorch's hooks, the
    floor under ``--level timing``: hooks that ask dynamo first (as hookdbg's must), a
    clock in each, and one hook on the gradient of each output, put there the cheapest
    way (as hookdbg does: a hooks dict registered with the node), that reads the clock."""
    starts: list[float] = []
    spans: list[float] = []
    clock = time.perf_counter
    traced = torch.compiler.is_dynamo_compiling

    def on_grad(grad: torch.Tensor) -> None:
        spans.append(clock())

    def pre(m: nn.Module, args: object) -> None:
        if traced():
            return
        starts.append(clock())

    def post(m: nn.Module, args: object, out: object) -> None:
        if traced():
            return
        spans.append(clock() - starts.pop())
        if type(out) is torch.Tensor and out.grad_fn is not None and out._backward_hooks is None:
            out._backward_hooks = {0: on_grad}
            out.grad_fn._register_hook_dict(out)

    yield from _hook_pair(pre, post)


@contextlib.contextmanager
def idle_hooks(_: Path) -> Iterator[None]:
    """The floor under steps that are not recorded: the hooks hookdbg keeps installed
    through them, each returning at once. A forward pre-hook, a forward hook that takes
    keyword inputs and runs when forward raises, and a post-accumulate-grad hook on each
    parameter, put there when its module is first called, as hookdbg does."""
    seen: set[int] = set()
    handles: list = []

    def on_param(p: torch.Tensor) -> None:
        return None

    def pre(m: nn.Module, args: object) -> None:
        if id(m) not in seen:
            seen.add(id(m))
            handles.extend(
                p.register_post_accumulate_grad_hook(on_param) for p in m.parameters(False)
            )

    a = module_hooks.register_module_forward_pre_hook(pre)
    b = module_hooks.register_module_forward_hook(
        lambda m, args, kwargs, out: None, with_kwargs=True, always_call=True
    )
    try:
        yield
    finally:
        a.remove()
        b.remove()
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def naive_stats(_: Path) -> Iterator[None]:
    """What a hand-written forward-only statistics hook does: min, max, sum and norm of
    each output, read back at once."""
    kept: list[tuple[float, ...]] = []

    def post(m: nn.Module, args: object, out: object) -> None:
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            with torch.no_grad():
                lo, hi = torch.aminmax(out)
                kept.append((lo.item(), hi.item(), out.sum().item(), out.norm().item()))

    b = module_hooks.register_module_forward_hook(post)
    try:
        yield
    finally:
        b.remove()


@contextlib.contextmanager
def profiler(_: Path) -> Iterator[None]:
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], with_modules=True
    ):
        yield


@contextlib.contextmanager
def anomaly(_: Path) -> Iterator[None]:
    with torch.autograd.detect_anomaly(check_nan=True):
        yield


def hookdbg_at(level: str, steps: str | None = None, nan_check: bool | None = None) -> Context:
    """``nan_check=False``: no check at all, the sentinel's included (its cost apart)."""

    @contextlib.contextmanager
    def recording(workdir: Path) -> Iterator[Recorder]:
        path = workdir / f"{level}-{steps}-{nan_check}.h5"
        with record(
            path, level=level, steps=steps, nan_check=nan_check, force=True, quiet=True
        ) as rec:
            yield rec

    return recording


def hookdbg_idle(workdir: Path) -> contextlib.AbstractContextManager[Recorder]:
    """``--idle``: no step recorded, each step's loss and the sentinel's checks watched."""
    return record(workdir / "idle.h5", idle=True, force=True, quiet=True)


@contextlib.contextmanager
def hookdbg_histograms(workdir: Path) -> Iterator[Recorder]:
    """--level stats with --histograms 32."""
    with record(workdir / "hist.h5", histograms=32, force=True, quiet=True) as rec:
        yield rec


CONFIGS: dict[str, Context] = {
    "empty hook pair": empty_hooks,
    "minimal timing hooks": timing_hooks,
    "minimal fwd+bwd timing hooks": fwd_bwd_timing_hooks,
    "idle hooks (as skipped steps keep)": idle_hooks,
    "naive fwd-only stats hooks": naive_stats,
    "torch.profiler(with_modules)": profiler,
    "detect_anomaly": anomaly,
    "hookdbg timing": hookdbg_at("timing"),
    "hookdbg timing --no-nan-check": hookdbg_at("timing", nan_check=False),
    "hookdbg shapes": hookdbg_at("shapes"),
    "hookdbg stats": hookdbg_at("stats"),
    "hookdbg stats, steps not recorded": hookdbg_at("stats", steps=f"{10**9}:"),
    "hookdbg not recorded --no-nan-check": hookdbg_at("stats", f"{10**9}:", nan_check=False),
    "hookdbg stats --histograms 32": hookdbg_histograms,
}


@dataclass
class Costs:
    """One configuration's seconds per step while recording (wall, CPU of all threads,
    CPU of the training thread: the rest is the writer's and other threads'), and CPU
    once."""

    per_step: tuple[float, float, float]
    once: float


def measure(step: Step, context: Context | None, warmup: int, steps: int, workdir: Path) -> Costs:
    """From the open, ``warmup`` steps, then ``steps`` timed ones, then the close. A
    recorder is flushed before and after the timed steps, so that they hold the writer's
    work on their own rows and no other (wall time waits for that last flush: an upper
    bound where the writer would have worked beside training)."""
    wall, cpu, own = time.perf_counter, time.process_time, time.thread_time
    cpu_open = cpu()
    with context(workdir) if context else contextlib.nullcontext() as recorder:
        flush = getattr(recorder, "flush", lambda: True)
        for _ in range(warmup):
            step()
        if not flush():
            raise RuntimeError("the recorder did not write the warm-up steps")
        wall0, cpu0, own0 = wall(), cpu(), own()
        for _ in range(steps):
            step()
        if not flush():
            raise RuntimeError("the recorder did not write the timed steps")
        wall1, cpu1, own1 = wall(), cpu(), own()
    per_step = ((wall1 - wall0) / steps, (cpu1 - cpu0) / steps, (own1 - own0) / steps)
    return Costs(per_step, cpu() - cpu_open - (warmup + steps) * per_step[1])


def compare(
    name: str,
    make: Callable[[], tuple[Step, int]],
    rounds: int,
    steps: int,
    configs: list[str],
) -> None:
    step, calls = make()
    warmup = WARMUP[name]
    results: dict[str | None, list[Costs]] = {None: [], **{c: [] for c in configs}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for config in (None, *configs):
                context = CONFIGS[config] if config else None
                results[config].append(measure(step, context, warmup, steps, Path(tmp)))
            print(f"  {name}: round {r + 1}/{rounds}", end="\r", file=sys.stderr)

    def medians(config: str | None) -> tuple[float, float, float, float]:
        """Per-step wall, CPU and the other threads' CPU; CPU once."""
        rounds = results[config]
        return (
            statistics.median(c.per_step[0] for c in rounds),
            statistics.median(c.per_step[1] for c in rounds),
            statistics.median(c.per_step[1] - c.per_step[2] for c in rounds),
            statistics.median(c.once for c in rounds),
        )

    base_wall, base_cpu, base_others, base_once = medians(None)
    print(
        f"\n{name}: {calls} module calls per step; unrecorded step {base_cpu * 1e3:.2f} ms CPU, "
        f"{base_wall * 1e3:.2f} ms wall (median over {rounds} rounds of {steps} steps after "
        f"{warmup}); 'writer': of the CPU us/call, other threads' (the writer's); 'once': "
        "open, first steps and close, CPU ms above unrecorded"
    )
    print(
        f"  {'':36s} {'CPU':>8s} {'us/call':>9s} {'writer':>7s}   {'wall':>8s} {'us/call':>9s}"
        f"   {'once':>7s}"
    )
    for config in configs:
        wall, cpu, others, once = medians(config)
        print(
            f"  {config:36s} {cpu / base_cpu:7.3f}x {(cpu - base_cpu) / calls * 1e6:+9.1f}"
            f" {(others - base_others) / calls * 1e6:+7.1f}"
            f"   {wall / base_wall:7.3f}x {(wall - base_wall) / calls * 1e6:+9.1f}"
            f"   {(once - base_once) * 1e3:+7.1f}"
        )


WORKLOADS = {
    "mlp": (mlp, 200),
    "resnet18": (resnet18, 8),
    "resnet18-224": (lambda: resnet18(64, 224), 8),
}
# steps before the timed ones: the flight recorder holds the last two steps, so by the
# fourth it is full and each step frees what it takes
WARMUP = {"mlp": 20, "resnet18": 4, "resnet18-224": 4}


def keep_freed_memory() -> bool:
    """Make glibc keep the memory freed during a step for the next one, in every
    configuration alike. By default it gives large freed blocks back to the system and
    takes them again, page by page, on the next step: 8% of an unrecorded resnet18 step
    on the CPU. A recorder that holds on to some tensors (the flight recorder) stops
    that, and so made resnet18 steps faster than unrecorded ones (0.90-0.95x). Whether
    glibc took the settings."""
    try:
        libc = ctypes.CDLL(None)
        trim, mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (<= 32 MB on 64-bit)
        return bool(libc.mallopt(trim, 1 << 30)) and bool(libc.mallopt(mmap, 32 << 20))
    except (OSError, AttributeError):  # not glibc
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave the allocator as it is (see keep_freed_memory)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--only", choices=list(WORKLOADS), help="one workload")
    parser.add_argument("--device", default="cpu", help="where the models run (cpu, cuda)")
    parser.add_argument(
        "--configs", metavar="TEXT", help="only the configurations whose name holds TEXT"
    )
    args = parser.parse_args()
    configs = [c for c in CONFIGS if args.configs is None or args.configs in c]
    if not configs:
        parser.error(f"no configuration's name holds {args.configs!r}: {', '.join(CONFIGS)}")
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else 7
    where = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "CPU"
    kept = not args.glibc_defaults and keep_freed_memory()
    print(
        f"torch {torch.__version__} on {where}, {args.threads} thread(s), {rounds} rounds"
        + (", freed memory kept (glibc)" if kept else "")
    )
    for name, (make, steps) in WORKLOADS.items():
        if name == "resnet18-224" and DEVICE.type == "cpu" and args.only != name:
            continue  # minutes per round on a CPU
        if args.only in (None, name):
            compare(name, make, rounds, steps, configs)


if __name__ == "__main__":
    main()
