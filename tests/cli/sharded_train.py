"""Sharded training, each strategy run unrecorded then recorded (hookdbg.record) in one
torchrun process group of 2 ranks (4: FSDP2 over tensor parallel on a 2-D mesh); rank 0
prints what tests/cli/test_sharded_runs.py checks, a JSON line per strategy. Usage:
torchrun --nproc-per-node N sharded_train.py OUT_DIR [STRATEGY ...]"""

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import hookdbg

faulthandler.dump_traceback_later(150, exit=True)  # a rank stuck in a collective

STEPS = 3


class Block(nn.Module):
    """An attention block small enough for a test: q, k, v, out and a norm."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 32), nn.Linear(32, dim)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        a = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v
        x = x + self.out(a)
        return x + self.down(torch.relu(self.up(x)))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(16, 1))


def fsdp(reshard: bool, mixed: bool, mesh=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    def make():
        m = model()
        policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if mixed else None
        kw = {"reshard_after_forward": reshard, **({"mp_policy": policy} if mixed else {})}
        if mesh is not None:
            kw["mesh"] = mesh
        for block in m[:2]:
            fully_shard(block, **kw)
        fully_shard(m, **kw)
        return m

    return make


def tp(mesh):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {
        f"{i}.{name}": style
        for i in range(2)
        for name, style in (
            ("q", ColwiseParallel()),
            ("k", ColwiseParallel()),
            ("v", ColwiseParallel()),
            ("out", RowwiseParallel()),
            ("up", ColwiseParallel()),
            ("down", RowwiseParallel()),
        )
    }

    def make():
        return parallelize_module(model(), mesh, plan)

    return make


def sequence_parallel(mesh):
    """A norm on sequence shards, then an MLP split by columns and rows."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        plan = {
            "0": SequenceParallel(),
            "1": ColwiseParallel(input_layouts=Shard(1)),
            "3": RowwiseParallel(output_layouts=Shard(1)),
        }
        return parallelize_module(m, mesh, plan)

    return make


def reduce_inside(make):
    """torchtitan's tensor parallel: each module's redistribution runs inside its own
    forward (a row-parallel Linear all-reduces there), not in hooks after it."""

    def made():
        net = make()
        for module in net.modules():
            hooks = list(module._forward_hooks.values())
            if not hooks:
                continue
            module._forward_hooks.clear()

            def forward(*args, _forward=module.forward, _hooks=hooks, _module=module):
                out = _forward(*args)
                for hook in _hooks:
                    result = hook(_module, args, out)
                    out = out if result is None else result
                return out

            module.forward = forward
        return net

    return made


class OptimizersContainer(torch.optim.Optimizer):
    """torchtitan's: an Optimizer whose step() steps one AdamW per model part."""

    def __init__(self, parts) -> None:
        self.optimizers = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in parts]
        super().__init__([p for part in parts for p in part.parameters()], {"lr": 1e-2})

    def step(self, closure=None):
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none)


def fsdp_tp(mesh2d):
    """torchtitan's 2-D layout: tensor parallel inside, FSDP2 across."""
    from torch.distributed.fsdp import fully_shard

    def make():
        m = tp(mesh2d["tp"])()
        for block in m[:2]:
            fully_shard(block, mesh=mesh2d["dp"])
        fully_shard(m, mesh=mesh2d["dp"])
        return m

    return make


def ddp_compiled():
    from torch.nn.parallel import DistributedDataParallel

    def make():
        return DistributedDataParallel(torch.compile(model(), backend="eager"))

    return make


def train(
    net: nn.Module, data_rank: int, poison: bool = False, nudge: bool = False, parts: bool = False
) -> list[float]:
    opt = OptimizersContainer(list(net)) if parts else torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    for i in range(STEPS):
        if poison and i == 1 and dist.get_rank() == 1:  # one rank's shard of a weight
            with torch.no_grad():
                net[0].q.weight._local_tensor[0, 0] = float("nan")
        if nudge and i == 1 and dist.get_rank() == 1:  # one replica of a norm's shard
            with torch.no_grad():
                net[0].norm.weight._local_tensor.mul_(1.001)
        g = torch.Generator().manual_seed(1000 * data_rank + i)
        x = torch.randn(4, 8, 16, generator=g)
        loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def full_norms(net: nn.Module) -> dict[str, float]:
    out = {}
    for name, p in net.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = float(full.detach().double().norm())
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh

    out_dir = sys.argv[1]
    if world == 4:
        mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        data_rank = mesh2d["dp"].get_local_rank()
        cases = {
            "fsdp_tp": (fsdp_tp(mesh2d), data_rank),
            "fsdp_tp_nan": (fsdp_tp(mesh2d), data_rank),
            "fsdp_tp_desync": (fsdp_tp(mesh2d), data_rank),
        }
    else:
        mesh = init_device_mesh("cpu", (world,))
        cases = {
            "fsdp": (fsdp(True, False), rank),
            "fsdp_keep_mixed": (fsdp(False, True), rank),
            "tp": (tp(mesh), 0),
            "sequence_parallel": (sequence_parallel(mesh), 0),
            "ddp_compiled": (ddp_compiled(), rank),
            "tp_nan": (tp(mesh), 0),
            "tp_inside_nan": (reduce_inside(tp(mesh)), 0),  # and an OptimizersContainer
            "fsdp_nan": (fsdp(True, False), rank),
        }
    only = sys.argv[2:]
    for name, (make, data_rank) in cases.items():
        if only and name not in only:
            continue
        poison, nudge = name.endswith("_nan"), name.endswith("_desync")
        parts = name == "tp_inside_nan"
        plain = train(make(), data_rank, poison, nudge, parts)
        net = make()
        with hookdbg.record(f"{out_dir}/{name}.h5", force=True, quiet=True) as rec:
            recorded = train(net, data_rank, poison, nudge, parts)
            live = bool(rec.guard.live)
        norms = full_norms(net)
        if rank == 0:
            print(
                json.dumps(
                    {
                        "case": name,
                        "plain": plain,
                        "recorded": recorded,
                        "norms": norms,
                        "live": live,
                    }
                ),
                flush=True,
            )
    dist.destroy_process_group()
    # every recording is closed and every result printed: leave before the interpreter
    # tears down torch's threads, which now and then aborts the process after all is done
    # ("terminate called without an active exception", 1 run in 9 on this machine)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
