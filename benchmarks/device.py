"""What hookdbg does on a CUDA device, checked on a real one (CI has none).

    python benchmarks/device.py              # every check, about two minutes on an H100
    python benchmarks/device.py --only sync

Each check prints one line starting with PASS, FAIL or INFO and the figures behind it:

* ``parity``: resnet18 (in-place ReLU, batch norm) recorded on the deferred device path
  says what the immediate path says (``--on-nan raise`` summarises each tensor at once).
* ``identical``: training on the GPU is bitwise identical with and without the recorder
  (deterministic algorithms on).
* ``sync``: recorded steps never make the host wait for the device
  (``torch.cuda.set_sync_debug_mode("error")`` around them).
* ``launches``: kernels launched per summarised tensor, counted by torch.profiler.
* ``origin``: a NaN born on the GPU is named (module, phase, step) as on the CPU.
* ``amp``: fp16 autocast with a GradScaler whose early steps overflow: the alerts and
  steps hookdbg reports.
* ``profiler``: resnet18 at 64x3x224x224 (device-bound): each top-level module's forward
  device time (CUDA events, hookdbg ``profile``) against torch.profiler's kernel time
  inside the same module (record_function ranges), within 10%.
* ``speed``: step time recorded / unrecorded (wall, synchronised each step; rounds of
  every configuration in turn in this process, the median of each): resnet18
  64x3x224x224 fp32 and bf16 autocast at ``stats`` (target <= 1.10x) and ``timing``
  (<= 1.02x), steps ``--every`` leaves unrecorded (<= 1.01x), and a Hugging Face GPT-2
  built from its config, bf16 autocast, batch 8 x 512 tokens, at ``stats`` (<= 1.15x).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn

import hookdbg
from hookdbg.store.schema import CHANGED_IN_PLACE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.helpers import tables  # noqa: E402  (the tests' reader: every table, h5py alone)

KEY = ("step", "module", "phase", "slot", "path")


def resnet(
    seed: int = 0, batch: int = 16, size: int = 64
) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    return model, opt, x, y


def train(model, opt, x, y, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def deterministic() -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def block() -> Iterator[None]:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)

    return block()


def check_parity(tmp: Path) -> bool:
    def run(path: Path, on_nan: str) -> np.ndarray:
        model, opt, x, y = resnet()
        with deterministic(), hookdbg.record(path, on_nan=on_nan, force=True, quiet=True):
            train(model, opt, x, y, 3)
        return tables(path)["tensors"]

    later, now = run(tmp / "later.h5", "warn"), run(tmp / "now.h5", "raise")
    a = {tuple(r[k] for k in KEY): r for r in now}
    b = {tuple(r[k] for k in KEY): r for r in later}
    differences = []
    changed = [key for key, y in b.items() if y["nan"] == CHANGED_IN_PLACE]
    if any(key[0] != 0 for key in changed):
        print(f"FAIL parity: rows changed in place after the first step: {changed[:4]}")
        return False
    for key, x in a.items():
        y = b.get(key)
        if key in changed:
            continue
        if y is None or (x["nan"], x["posinf"], x["neginf"]) != (
            y["nan"],
            y["posinf"],
            y["neginf"],
        ):
            print(f"FAIL parity: row {key} differs or is missing")
            return False
        if x["nan"] or x["posinf"] or x["neginf"] or x["std"] != x["std"]:
            continue
        scale = max(abs(float(x["std"])), 1e-30)
        for stat in ("min", "max", "mean", "std"):
            gap = abs(float(x[stat]) - float(y[stat])) / scale
            differences.append((gap, stat, key, float(x[stat]), float(y[stat]), x["dtype"]))
    differences.sort(reverse=True)
    worst = differences[0][0] if differences else 0.0
    ok = len(a) == len(b) and worst < 1e-4
    print(
        f"{'PASS' if ok else 'FAIL'} parity: {len(a)} vs {len(b)} rows, largest difference "
        f"{worst:.2e} of the std (immediate vs deferred); {len(changed)} rows of the first "
        "step changed in place before they were summarised"
    )
    for gap, stat, key, x, y, dtype in differences[:4]:
        print(f"      {gap:.2e} {stat} of {key} ({dtype}): immediate {x!r}, deferred {y!r}")
    return ok


def check_identical(tmp: Path) -> bool:
    with deterministic():
        model, opt, x, y = resnet()
        train(model, opt, x, y, 4)
        plain = [p.detach().clone() for p in model.parameters()]
        model, opt, x, y = resnet()
        with hookdbg.record(tmp / "id.h5", force=True, quiet=True):
            train(model, opt, x, y, 4)
        recorded = [p.detach().clone() for p in model.parameters()]
    same = all(torch.equal(p, q) for p, q in zip(plain, recorded, strict=True))
    print(f"{'PASS' if same else 'FAIL'} identical: parameters after 4 steps, bitwise")
    return same


def check_sync(tmp: Path) -> bool:
    model, opt, x, y = resnet()
    with hookdbg.record(tmp / "sync.h5", force=True, quiet=True):
        train(model, opt, x, y, 2)  # warm-up: first allocations, pinned buffers
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            train(model, opt, x, y, 3)
        except RuntimeError:
            print("FAIL sync: a recorded step waited for the device:")
            traceback.print_exc(limit=-8)
            return False
        finally:
            torch.cuda.set_sync_debug_mode("default")
    print("PASS sync: 3 recorded resnet18 steps, no host-device synchronisation")
    return True


def check_launches(tmp: Path) -> bool:
    from torch.profiler import ProfilerActivity, profile

    def kernels(recording: bool) -> tuple[int, int]:
        model, opt, x, y = resnet()
        path = tmp / "launch.h5"
        context = hookdbg.record(path, force=True, quiet=True) if recording else None
        if context:
            context.__enter__()
        try:
            train(model, opt, x, y, 2)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                train(model, opt, x, y, 1)
                torch.cuda.synchronize()
        finally:
            if context:
                context.__exit__(None, None, None)
        count = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
        rows = int((tables(path)["tensors"]["step"] == 2).sum()) if recording else 0
        return count, rows

    plain, _ = kernels(False)
    recorded, rows = kernels(True)
    per = (recorded - plain) / max(rows, 1)
    ok = per <= 0.25
    print(
        f"{'PASS' if ok else 'FAIL'} launches: {plain} kernels unrecorded, {recorded} recorded, "
        f"{rows} tensors summarised: {per:.2f} extra kernels per tensor"
    )
    return ok


def check_origin(tmp: Path) -> bool:
    sys.path.insert(0, str(ROOT / "samples"))
    from nan_blowup import Net  # type: ignore[import-not-found]

    def alerts(device: str) -> set[tuple]:
        torch.manual_seed(0)
        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        path = tmp / f"origin-{device}.h5"
        with hookdbg.record(path, force=True, quiet=True):
            for step in range(4):
                x = torch.randn(8, 16, device=device)
                if step == 2:
                    x[3] = 1.0  # a constant row: 0/0 in Standardize
                keep = torch.ones(8, 1, device=device)
                opt.zero_grad()
                model(x, keep).pow(2).mean().backward()
                opt.step()
        t = tables(path)
        names = {int(r["id"]): r["name"].decode() for r in t["modules"]}
        return {(names[int(r["module"])], int(r["phase"]), int(r["step"])) for r in t["alerts"]}

    cpu, gpu = alerts("cpu"), alerts("cuda")
    ok = cpu == gpu and len(gpu) == 1
    print(f"{'PASS' if ok else 'FAIL'} origin: CPU names {sorted(cpu)}, GPU names {sorted(gpu)}")
    return ok


def check_amp(tmp: Path) -> bool:
    """fp16 autocast; a GradScaler starting at 2**40 overflows for its first steps."""
    model, opt, x, y = resnet()
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)
    iterations, skipped = 12, 0
    path = tmp / "amp.h5"
    with hookdbg.record(path, force=True, quiet=True):
        for _ in range(iterations):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
    t = tables(path)
    steps, alerts = t["steps"], t.get("alerts", ())
    ok = len(alerts) == 0 and len(steps) == iterations and int(steps["skipped"].sum()) == skipped
    print(
        f"{'PASS' if ok else 'FAIL'} amp: {iterations} iterations, {skipped} skipped by the "
        f"GradScaler; hookdbg: {len(steps)} steps, {int(steps['skipped'].sum())} skipped, "
        f"{len(alerts)} alerts"
    )
    for r in alerts[:3]:
        print("     ", r["message"].decode()[:200])
    return ok


def check_profiler(tmp: Path) -> bool:
    """Forward device times of resnet18's top-level modules against the kernel time
    torch.profiler puts inside record_function ranges around the same calls."""
    from torch.profiler import ProfilerActivity, profile

    from hookdbg.analysis.profile import profile as hookdbg_profile
    from hookdbg.read import open_recording

    model, opt, x, y = resnet(batch=64, size=224)
    train(model, opt, x, y, 3)
    path = tmp / "profiler.h5"
    with hookdbg.record(path, force=True, quiet=True, level="timing"):
        train(model, opt, x, y, 6)
    with open_recording(path) as rec:
        ours = {
            r.module.name.removeprefix("model."): r.device_total_mean
            for r in hookdbg_profile(rec, 2, 5).rows
            if r.phase == 0 and r.module.depth == 1
        }
    ranges: dict[str, object] = {}
    handles = []
    for name, child in model.named_children():

        def enter(module, args, name=name):
            ranges[name] = torch.profiler.record_function(name).__enter__()

        def leave(module, args, output, name=name):
            ranges.pop(name).__exit__(None, None, None)

        handles += [child.register_forward_pre_hook(enter), child.register_forward_hook(leave)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        train(model, opt, x, y, 4)
        torch.cuda.synchronize()
    for h in handles:
        h.remove()
    theirs = {
        e.key: getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) * 1e-6 / 4
        for e in prof.key_averages()
        if e.key in ours
    }
    worst, lines = 0.0, []
    for name, mine in sorted(ours.items(), key=lambda kv: -kv[1]):
        other = theirs.get(name, 0.0)
        gap = abs(mine - other) / other if other else float("inf")
        if other > 5e-4:  # modules of at least half a millisecond
            worst = max(worst, gap)
        lines.append(
            f"      {name:10s} hookdbg {mine * 1e3:8.3f} ms  profiler {other * 1e3:8.3f} ms"
        )
    ok = worst <= 0.10
    print(
        f"{'PASS' if ok else 'FAIL'} profiler: forward device time per module within "
        f"{worst:.1%} of torch.profiler's kernel time (resnet18 64x3x224x224, modules >= 0.5 ms)"
    )
    print("\n".join(lines))
    return ok


Step = Callable[[], None]


def resnet_step(batch: int, size: int, bf16: bool) -> Step:
    model, opt, x, y = resnet(batch=batch, size=size)

    def step() -> None:
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step


def gpt2_step() -> Step:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 512), device="cuda")

    def step() -> None:
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()

    return step


def timed(step: Step, steps: int) -> float:
    """Median wall time of ``steps`` steps, synchronised each step."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ratios(tmp: Path, step: Step, configs: dict[str, dict], rounds: int = 3) -> dict[str, float]:
    """Each configuration's step time over the unrecorded one's, from ``rounds`` rounds
    of all of them in turn (the median of each)."""
    for _ in range(3):
        step()  # warm-up: cudnn's choices, the caching allocator
    seen: dict[str, list[float]] = {"unrecorded": [], **{name: [] for name in configs}}
    for _ in range(rounds):
        seen["unrecorded"].append(timed(step, 10))
        for name, options in configs.items():
            with hookdbg.record(tmp / "speed.h5", force=True, quiet=True, **options):
                for _ in range(3):
                    step()  # the recorder's first steps: pools, learned copies, Triton
                seen[name].append(timed(step, 10))
    base = statistics.median(seen["unrecorded"])
    print(f"      unrecorded {base * 1e3:.2f} ms per step")
    return {name: statistics.median(v) / base for name, v in seen.items() if name != "unrecorded"}


def check_speed(tmp: Path) -> bool:
    ok = True

    def report(workload: str, got: dict[str, float], targets: dict[str, float]) -> None:
        nonlocal ok
        for name, ratio in got.items():
            target = targets[name]
            passed = ratio <= target
            ok = ok and passed
            print(
                f"{'PASS' if passed else 'FAIL'} speed: {workload} {name}: {ratio:.3f}x "
                f"(target <= {target:.2f}x)"
            )

    configs = {
        "stats": {},
        "timing": {"level": "timing"},
        "steps not recorded": {"every": 10_000},
    }
    targets = {"stats": 1.10, "timing": 1.02, "steps not recorded": 1.01}
    for bf16 in (False, True):
        workload = f"resnet18 64x3x224x224 {'bf16' if bf16 else 'fp32'}"
        got = ratios(
            tmp,
            resnet_step(64, 224, bf16),
            configs if not bf16 else dict(list(configs.items())[:2]),
        )
        report(workload, got, targets)
    try:
        step = gpt2_step()
    except ImportError:
        print("INFO speed: transformers is not installed here: GPT-2 not measured")
        return ok
    report("GPT-2 8x512 bf16", ratios(tmp, step, {"stats": {}}), {"stats": 1.15})
    return ok


def check_host(tmp: Path) -> bool:
    """Where the host's time goes in recorded steps (INFO: cProfile of 6 steps of resnet18
    64x3x224x224 at each level, the functions that take most of it)."""
    import cProfile
    import pstats

    step = resnet_step(64, 224, False)
    for level in ("timing", "stats"):
        with hookdbg.record(tmp / "host.h5", force=True, quiet=True, level=level):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            t0 = time.perf_counter()
            profiler.enable()
            for _ in range(6):
                step()
                torch.cuda.synchronize()
            profiler.disable()
            wall = (time.perf_counter() - t0) / 6
        stats = pstats.Stats(profiler)
        print(f"INFO host: {level}, {wall * 1e3:.1f} ms per step under cProfile; top by own time:")
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:22]  # type: ignore[attr-defined]
        for (file, line, name), (_, calls, own, cumulative, _) in rows:
            where = f"{Path(file).name}:{line}({name})"
            print(
                f"      {own / 6 * 1e3:7.2f} ms own {cumulative / 6 * 1e3:7.2f} cum "
                f"{calls // 6:6d} calls  {where}"
            )
    return True


CHECKS: dict[str, Callable[[Path], bool]] = {
    "parity": check_parity,
    "identical": check_identical,
    "sync": check_sync,
    "launches": check_launches,
    "origin": check_origin,
    "amp": check_amp,
    "profiler": check_profiler,
    "speed": check_speed,
    "host": check_host,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(CHECKS), action="append")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/device.py: no CUDA device here")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in CHECKS.items():
            if args.only and name not in args.only:
                continue
            try:
                ok = check(Path(tmp))
            except Exception:
                print(f"FAIL {name}: raised")
                traceback.print_exc()
                ok = False
            if not ok:
                failed.append(name)
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)


if __name__ == "__main__":
    main()
