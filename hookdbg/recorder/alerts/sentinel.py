"""The sentinel: NaN/inf checked at every level, in the steps whose module calls are
not (``--level timing`` or ``shapes``, a step ``--every`` or ``--idle`` leaves out).

At ``--level stats`` every tensor of a recorded step is checked and the origin rules
(nonfinite.py) name where a NaN was born; that costs a pass over every module's
tensors. Where those checks are off, the sentinel reads only what a non-finite value
on its way to the weights cannot avoid: the outputs of each top-level module call (what
the model returns to the script, even a script that skips ``backward()`` on a bad
loss), the loss a backward pass starts from (backward.py), and the gradients an
optimizer step is given (their norms: NaN and inf reach a norm). It cannot say where
a value was born, only in which step and what it reached; with ``--on-nan record`` (the
default) the steps after it are recorded at stats (``Recorder._zoom``), so a NaN that
comes again has its origin named without a restart.

On the host a finding is known at once. On a device the counts are left there, and
read once at the next segment's beginning (or at the end of the recording), so the
sentinel waits for the device at most once a step, never inside the step. A value that
stays non-finite is said once, where it appeared: it is said again only after the
sentinel found that place finite again, and in one step only the first finding is said
(the model's output, else the loss, else the gradients): the rest spread from it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from time import time

import torch

from hookdbg.recorder.alerts.alert import Alert
from hookdbg.recorder.alerts.nonfinite import OriginDetector, weights_note
from hookdbg.recorder.calls.calls import Segment
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.calls.tensors import iter_tensors
from hookdbg.recorder.summaries import stats
from hookdbg.store.schema import ModuleKind, Phase, Slot

ZOOM = "zoom"  # the key of the info row saying which steps a finding had recorded
Found = Callable[[list[float]], "Alert | None"]  # the alert for a device's read values


class Sentinel:
    """What the sentinel checks, and its findings waiting on a device."""

    def __init__(
        self,
        detector: OriginDetector,
        alert: Callable[..., None],
        weights: Callable[[], list[str]],
    ) -> None:
        self.detector = detector  # its ``step_tainted``: a finding said in this step
        self.alert = alert  # queues an alert (actions.py) with its live objects
        self.weights = weights  # the parameters holding NaN/inf now, by full name
        self.armed = False  # the current segment's module calls are not checked
        # a problem was found (by the checks of a segment before, or the sentinel) and
        # the sentinel has seen nothing finite since: what it finds spread from that
        self.spread = False
        self.defer_all = False  # findings on the host read as a device's are (tests)
        self.grads_read = False  # a backward pass of this segment had them read
        self._bad: set[tuple[int, int]] = set()  # (module id, slot) last found non-finite
        # the modules with parameters of their own, as last looked up (when the registry
        # held that many modules); held by the registry's weak references only
        self._holders: list[ModuleInfo] = []
        self._holders_of = -1
        self._pending: list[tuple[torch.Tensor, Found]] = []

    def begin(self, checked: bool, tainted: bool) -> None:
        """A segment begins, its module calls ``checked`` or not; ``tainted``: those of
        the segment before found a NaN/inf (read only if they were checked)."""
        self.read()  # what it left on a device in the segment before
        if not self.armed:
            self.spread = tainted
        self.armed = not checked
        self.grads_read = False

    def outputs(
        self, info: ModuleInfo, module: torch.nn.Module, args: tuple, result: object, seg: Segment
    ) -> None:
        """A top-level call of ``module`` (``info``) on ``args`` returned ``result`` in
        ``seg``. Inside torch.func's transforms (``vmap``, ``grad``), the values under
        the wrappers are read."""
        if not self.armed:
            return
        call = (info, module, args, result, seg)
        if not stats.transforms_active():
            self._outputs(*call, stats.local)
            return
        with stats.outside_transforms():
            self._outputs(*call, stats.physical)

    def _outputs(
        self,
        info: ModuleInfo,
        module: torch.nn.Module,
        args: tuple,
        result: object,
        seg: Segment,
        values: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        key = (info.id, int(Slot.OUTPUT))
        left: list[tuple[str, torch.Tensor]] = []  # on a device: counted there, read later
        for path, t in iter_tensors(result):
            v = values(t)
            if not _readable(v):
                continue
            v = v.detach()
            if v.is_cpu and not self.defer_all:
                if _finite_on_host(v):
                    continue
                found = self._output(key, info, [(path, v)], seg)
                # found at once: the op-level check may run the call again on its inputs
                self._judge(found, _counts(v).tolist(), module=module, inputs=args, output=result)
                return
            left.append((path, v))
        if left:  # one reading for all of them: one finding of the call
            counts = torch.cat([_counts(v).to(left[0][1].device) for _, v in left])
            self._pending.append((counts, self._output(key, info, left, seg)))
        else:
            self._once(key, False)

    def backward_ended(self, registry: ModuleRegistry, seg: Segment) -> None:
        """A backward pass ended: the gradients the modules' parameters hold now. Read
        here, not only at an optimizer step, so that a script that skips the step on a
        bad gradient norm (or has no optimizer) has them read too."""
        if not self.armed:
            return
        if len(registry.infos) != self._holders_of:  # modules seen since: look again
            self._holders_of = len(registry.infos)
            self._holders = [
                info
                for info in registry.infos
                if info.kind == ModuleKind.MODULE and getattr(info.ref(), "_parameters", None)
            ]
        held = [
            (name, info, p.grad)
            for info in self._holders
            for name, p in getattr(info.ref(), "_parameters", {}).items()
            if p is not None
        ]
        self.grads_read = True
        self._gradients((-1, int(Slot.PARAM_GRAD)), held, seg, Phase.BWD)

    def gradients(
        self, opt: torch.optim.Optimizer, opt_info: ModuleInfo, owner: dict, seg: Segment
    ) -> None:
        """An optimizer step begins with the gradients its parameters hold, where no
        backward pass read them since the segment began (set by hand, or by another
        hook). ``owner`` names a parameter by id (its module's info and its name); one it
        does not know goes under the optimizer's ``opt_info``."""
        if not self.armed or self.grads_read:
            return
        held = []
        for g_index, group in enumerate(opt.param_groups):
            for p_index, p in enumerate(group["params"]):
                info, name = owner.get(id(p), (opt_info, f"param_groups[{g_index}][{p_index}]"))
                held.append((name, info, p.grad))
        self._gradients((id(opt), int(Slot.STEP_GRAD)), held, seg, Phase.OPT)

    def _gradients(
        self,
        key: tuple[int, int],
        held: list[tuple[str, ModuleInfo, torch.Tensor | None]],
        seg: Segment,
        phase: Phase,
    ) -> None:
        # per gradient, as little as can be: it runs for every parameter of every step
        present = [(n, i, g) for n, i, g in held if g is not None and g.layout is _STRIDED]
        on_host = [] if self.defer_all else [h for h in present if h[2].is_cpu]
        if on_host:
            norms = stats.norms_of([g for _, _, g in on_host])  # in double: no overflow
            if not all(map(math.isfinite, norms)):
                grads = [(name, info, stats.local(g)) for name, info, g in on_host]
                self._judge(self._gradient(key, grads, seg, phase), norms)
                return
        by_device: dict[torch.device, list[tuple[str, ModuleInfo, torch.Tensor]]] = {}
        for name, info, grad in present if len(on_host) < len(present) else ():
            g = stats.local(grad)
            if (self.defer_all or not g.is_cpu) and _readable(g):
                by_device.setdefault(g.device, []).append((name, info, g.detach()))
        for grads in by_device.values():  # one fused call each, left on the device
            norms_left = torch._foreach_norm([g for _, _, g in grads], 2.0, dtype=torch.float32)
            self._pending.append((torch.stack(norms_left), self._gradient(key, grads, seg, phase)))
        if not by_device:
            self._once(key, False)

    def read(self) -> None:
        """Read the findings left on a device (one wait for it), and alert on them."""
        pending, self._pending = self._pending, []
        for values, found in pending:
            self._judge(found, values.tolist())

    def _judge(self, found: Found, values: list[float], **context: object) -> None:
        self.alert(found(values), **context)

    def _once(self, key: tuple[int, int], bad: bool) -> bool:
        """Whether a finding at ``key`` is to be said: bad, and not bad when last read."""
        if not bad:
            self._bad.discard(key)
            self.spread = False
            return False
        detector = self.detector
        said = key in self._bad or self.spread or detector.step_tainted
        self._bad.add(key)
        detector.step_tainted = self.spread = True  # what it finds next spread from it
        return not said

    def _output(
        self,
        key: tuple[int, int],
        info: ModuleInfo,
        tensors: list[tuple[str, torch.Tensor]],
        seg: Segment,
    ) -> Found:
        """The alert on the first of a call's output ``tensors`` holding NaN/inf, from
        their counts (three each, in order)."""
        shapes = [(path, stats.shape_only(v)) for path, v in tensors]

        def found(counts: list[float]) -> Alert | None:
            bad = [i for i in range(len(shapes)) if any(counts[3 * i : 3 * i + 3])]
            if not self._once(key, bool(bad)):
                return None
            path, shape = shapes[bad[0]]
            nan, posinf, neginf = (int(n) for n in counts[3 * bad[0] : 3 * bad[0] + 3])
            where = (info, Phase.FWD, Slot.OUTPUT, path)
            return self._finding(seg, where, stats.with_counts(shape, nan, posinf, neginf), "")

        return found

    def _finding(
        self,
        seg: Segment,
        where: tuple[ModuleInfo, Phase, Slot, str],
        summary: stats.Summary,
        what: str,
    ) -> Alert:
        """The alert on a finding at ``where`` (module, phase, slot, path): ``what`` it
        was, that its module calls were not checked, and what the weights were then."""
        info, phase, slot, path = where
        note = f"{what}{_UNCHECKED}; {weights_note(self.weights())}"
        return Alert(seg, -1, info, phase, slot, path, summary, time(), note, unchecked=True)

    def _gradient(
        self,
        key: tuple[int, int],
        grads: list[tuple[str, ModuleInfo, torch.Tensor]],
        seg: Segment,
        phase: Phase,
    ) -> Found:
        """The alert on the first of ``grads`` whose norm is not finite. A device's norms
        are in float32: values beyond about 1e19 overflow them, so a gradient still there
        is counted, and one that is finite after all is no finding. The gradients are
        held by weak reference only: one freed (``zero_grad``) or changed before a
        device's norms are read is said by its norm, its count unknown."""
        named = [
            (name, info, stats.shape_only(g), weakref.ref(g), g._version) for name, info, g in grads
        ]

        def counted(i: int, norm: float) -> tuple[tuple[int, int, int], str]:
            g, version = named[i][3](), named[i][4]
            if g is not None and g._version == version:
                nan, posinf, neginf = (int(n) for n in _counts(g).tolist())
                return (nan, posinf, neginf), ""
            if math.isnan(norm):
                return (1, 0, 0), " (at least one NaN: it changed before it could be counted)"
            return (0, 1, 0), (
                " (its norm was inf, read after it changed: an inf, or values beyond about 1e19)"
            )

        def found(norms: list[float]) -> Alert | None:
            bad = []
            for i, norm in enumerate(norms):
                if not math.isfinite(norm):
                    counts, note = counted(i, norm)
                    if any(counts):
                        bad.append((i, counts, note))
            if not self._once(key, bool(bad)):
                return None
            first, (nan, posinf, neginf), note = bad[0]
            name, info, shape = named[first][:3]
            more = len(bad) - 1
            also = (
                ""
                if not more
                else "; 1 other parameter's gradient too"
                if more == 1
                else f"; {more} other parameters' gradients too"
            )
            given = "a backward pass left" if phase == Phase.BWD else "an optimizer step was given"
            where = (info, phase, Slot(key[1]), name)
            summary = stats.with_counts(shape, nan, posinf, neginf)
            return self._finding(seg, where, summary, f"the gradient {given}{note}{also}; ")

        return found


_UNCHECKED = (
    "its module calls were not checked (--level timing or shapes, or a step --every or "
    "--idle leaves out), so the module where it was born is not known"
)


_STRIDED = torch.strided


def _readable(t: torch.Tensor | None) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dtype.is_floating_point
        and t.layout is torch.strided
        and not t.is_meta
        and t.numel() > 0
    )


def _finite_on_host(v: torch.Tensor) -> bool:
    """One pass: NaN reaches the minimum and maximum, and so does an inf."""
    flat = v.reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()
    lo, hi = torch.aminmax(flat)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def _counts(v: torch.Tensor) -> torch.Tensor:
    """NaN, +inf and -inf counts of ``v``, left where it is."""
    return torch.stack([torch.isnan(v).sum(), torch.isposinf(v).sum(), torch.isneginf(v).sum()])
