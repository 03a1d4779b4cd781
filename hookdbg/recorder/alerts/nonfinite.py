"""Where a NaN or inf was born, as opposed to everywhere it spread to, and which infs
are no problem at all.

Once a value goes NaN it poisons everything downstream, so "module X has a NaN" is
rarely news; the useful answer is the *origin*. And not every inf is a problem: models
put ``-inf`` in attention masks on purpose (``generate_square_subsequent_mask``, key
padding masks turned into float masks, ``masked_fill(-inf)`` before a softmax), and
masked logits carry it into losses that handle it. So hookdbg's rule is:

* **NaN is never a mask.** Any NaN is a problem.
* **+/-inf is a mask until it proves otherwise.** A module that receives inf and passes
  on only finite values absorbed it (a softmax over a masked row): nothing to report.
  An inf is a problem once a module passes it on (it received infs and its own output
  holds infs too), once the model returns it to the script (an output of a module
  called at the top level), once it turns into a NaN, or once it makes a gradient
  non-finite. So a mask built by one submodule and absorbed by another is no problem,
  and a module that takes an additive ``-inf`` mask and returns values still holding
  ``-inf`` is reported.

An alert names the origin of a problem:

* forward: the module whose output holds a NaN (or an inf loss) while its inputs held
  no NaN, its parameters were finite and none of its submodules already had a problem
  (so the module's own code made it). If its inputs held infs, the alert says which and
  where they came from (the data, tensor code, or the module whose output first had
  them): a fully masked attention row, or an overflow upstream;
* forward, passed on: where an inf that a module passed on was born: the module whose
  output first held it, or the data or tensor code if no module produced it;
* forward, from before: a parameter already non-finite when its module runs, with no
  origin found before it in the recording: it became so where nothing was recorded (a
  step ``--every``/``--steps`` skipped, or before the recording began);
* forward, from outside: a NaN in a module input that no recorded module produced (the
  data, or tensor code between modules);
* backward: the gradient w.r.t. a module's input is non-finite while the gradients
  w.r.t. its outputs were finite, no module inside it had non-finite gradients and its
  forward saw no NaN, or a parameter's gradient is non-finite while its module's output
  gradients were finite;
  a non-finite gradient that reaches a tensor whose forward value already held an inf
  is reported where that inf was born;
* optimizer: a parameter is non-finite right after a step although its gradient was
  finite (a too-large learning rate, Adam with eps=0);
* distributed, received: a value that came from another rank through a collective is
  no origin here; the first such value of a step is said where it arrived, as having
  come from another rank (its origin is named on the rank it was born on), and what it
  spreads to afterwards is not. Under DDP, the gradient a step uses (all-reduced) is
  non-finite although this rank's own gradient was finite; under FSDP2, a weight as
  gathered is non-finite although this rank's shard of it was finite; under tensor
  parallel, a module's output is NaN although its inputs and this rank's parameters
  were finite, and a collective reduced or gathered other ranks' values into it: a
  child's partial sum reduced after its hook, or a collective run inside its own
  forward (recorder/hooks/collectives.py);
* the loss: what a backward pass starts from (recorder/hooks/backward.py) is non-finite
  while every module output of the step was finite: born in the loss computation,
  after the model that ran last;
* unknown provenance, counted only if nothing non-finite was seen earlier in the step
  (otherwise it is almost surely spread, not born): a NaN module input that no recorded
  module produced, and an output gradient that feeds no module: born in the backward
  pass of the loss computation, or of tensor code between that module and the one
  whose backward ran just before (the gradient hooks know which).

Propagation is tracked with a few flags on each ``Call`` (nan_in, inf_inputs, tainted,
bad_grad, below_bad) and ``SeenTensor`` (birth, alerted) and one per step, so each check is
O(1) and only runs when a summary is already non-finite. The ``Alert`` these rules make,
and its words, are recorder/alerts/alert.py.
"""

from __future__ import annotations

import torch

from hookdbg.ranks import initialized_process_group
from hookdbg.recorder.alerts.alert import Alert, checked, finite_inputs_note, has_nan
from hookdbg.recorder.calls.calls import Call, SeenTensor, Segment
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.summaries.stats import NUMEL, Summary, local, summarise
from hookdbg.store.schema import ModuleKind, Phase, Slot


class OriginDetector:
    """Applies the rules above; each method returns an ``Alert`` for an origin, else None."""

    def __init__(self) -> None:
        self.alerts = 0
        self.born = 0  # of them, origins the checks named (not the sentinel's findings)
        self.origins: dict[tuple, int] = {}  # (module, phase, slot, path) -> occurrences
        self.step_tainted = False  # a problem was seen in the current step
        # the segment in which a parameter was found non-finite with no origin before it:
        # there, non-finite weights after the optimizer step may well be the same ones
        self.unrecorded_in: int | None = None
        # the steps before the current one were all recorded and checked (set by
        # segments.py): a weight non-finite at a forward changed outside the optimizer
        self.watched = False
        # a NaN/inf came from another rank (its shard, a collective): what turns
        # non-finite on this rank later (its weights, after the optimizer step) spread
        self.from_elsewhere = False
        # the loss of steps that are not recorded is watched too (--idle, --every):
        # set from the options; ``loss_bad``: the last loss, recorded or not, was
        # non-finite (a NaN that stays is said once, where it appeared)
        self.watch_loss = True
        self.loss_bad = False
        # the weights found non-finite after the last optimizer step, by module id: what
        # a check replayed once the script let its model go knows of its parameters
        self.bad_weights: dict[int, set[str]] = {}

    def weight_after_step(self, module: int, name: str, finite: bool) -> None:
        """An optimizer step left parameter ``name`` of module ``module`` as said."""
        if finite:
            self.bad_weights.get(module, set()).discard(name)
        else:
            self.bad_weights.setdefault(module, set()).add(name)

    def new_step(self) -> None:
        self.step_tainted = False

    def is_new_origin(self, alert: Alert) -> bool:
        """Count the alert; True the first time its place shows up (warn once per place).
        The sentinel's findings (sentinel.py) have places of their own, and none of them
        is the run's first origin: that is where the checks name one."""
        key = (alert.module.id, alert.phase, alert.slot, alert.path, alert.unchecked)
        seen = self.origins.get(key, 0)
        self.origins[key] = seen + 1
        alert.first = self.born == 0 and not alert.unchecked  # the first origin named
        self.born += not alert.unchecked
        alert.again = seen > 0
        self.alerts += 1
        return seen == 0

    def _unknown_provenance_ok(self) -> bool:
        clean, self.step_tainted = not self.step_tainted, True
        return clean

    # -- forward ----------------------------------------------------------------------

    def forward_input(
        self, call: Call, path: str, seen: SeenTensor, seg: Segment, now: float
    ) -> Alert | None:
        """A non-finite tensor reached ``call`` as input ``path``."""
        summary = checked(seen.summary)
        if not has_nan(summary):  # infs only: maybe a mask; see whether it is absorbed
            if call.inf_inputs is None:
                call.inf_inputs = []
            call.inf_inputs.append((path, seen))
            if seen.producer is None and seen.birth is None and not self.step_tainted:
                seen.birth = _from_outside(call, path, summary, seg, now)
            return None
        call.nan_in = True
        call.tainted = True
        if seen.producer is not None or seen.alerted:
            return None
        if (-1 if call.parent is None else call.parent.id) in seg.reduced:
            # its caller computed it from a partial sum another rank's values reduced into
            seen.alerted = True
            return self._received(
                seg,
                call,
                Slot.INPUT,
                path,
                summary,
                now,
                "no recorded module produced it, and its caller computed it from values "
                "a collective brought from other ranks",
                "tensor parallel's reduction",
                not self.step_tainted,
            )
        seen.alerted = True
        if not self._unknown_provenance_ok():
            return None
        return _from_outside(call, path, summary, seg, now)

    def forward_output(
        self, call: Call, path: str, seen: SeenTensor, module: object, seg: Segment, now: float
    ) -> Alert | None:
        """Output ``path`` of ``call`` is non-finite; called after its inputs' checks.
        ``module``: None when a deferred check cannot read its weights as they were (the
        script let it go, or its step's optimizer stepped since): then what the last
        optimizer step left of them is what is known."""
        if any(c is call and s == Slot.GRAD_INPUT for c, s, _ in seen.slots()):
            return None  # it returned a tensor it was given
        root = call.parent is None  # what it returns goes to the script itself
        if seen.producer is not call and not root:
            return None  # a submodule made it (and was judged for it)
        summary = checked(seen.summary)
        nan = has_nan(summary)
        clean = not self.step_tainted  # nothing seen before it in the step
        if nan or root or call.inf_inputs:
            self.step_tainted = True
        if call.tainted or call.nan_in or seen.alerted:
            call.tainted = True
            return None
        bad: tuple[str, torch.Tensor | None, bool | None] | None
        if module is not None:
            bad = _nonfinite_param(module, call)
        else:  # what the last optimizer step left of its weights (replayed in order)
            names = self.bad_weights.get(call.info.id)
            bad = (min(names), None, None) if names else None
        if bad is not None:
            call.tainted = True
            name, param, own = bad
            if own is False and param is not None:  # this rank's shard is finite: gathered
                return self._received(
                    seg,
                    call,
                    Slot.PARAM,
                    name,
                    summarise(local(param).detach()),
                    now,
                    "this rank's shard of it was finite",
                    "FSDP2's all-gather",
                    clean,
                )
            return self._param_before(call, bad, seg, now)
        if nan and call.id in seg.reduced:  # through a collective: another rank's
            call.tainted = seen.alerted = True
            return self._received(
                seg,
                call,
                Slot.OUTPUT,
                path,
                summary,
                now,
                "its inputs and this rank's parameters were finite",
                "a collective that reduced or gathered other ranks' values into it "
                "(tensor parallel)",
                clean,
            )
        if nan or (root and summary[NUMEL] == 1 and not call.inf_inputs):  # NaN, or an inf loss
            seen.alerted = call.tainted = True
            return Alert(
                seg,
                call.id,
                call.info,
                Phase.FWD,
                Slot.OUTPUT,
                path,
                summary,
                now,
                finite_inputs_note(call),
                origin=call,
            )
        if call.inf_inputs:  # it received infs and passes infs on: no mask
            birth = seen.birth = _received_birth(call)
            return self._passed_on(birth, seen, call, "passed it on", now)
        if seen.birth is None:  # an inf made here (or below): a mask until it proves otherwise
            seen.birth = call.inf_below or Alert(
                seg,
                call.id,
                call.info,
                Phase.FWD,
                Slot.OUTPUT,
                path,
                summary,
                now,
                "its inputs and parameters were finite",
                origin=call,
            )
        if not root:
            if seen.birth.origin is call:
                call.note_inf_below(seen.birth)
            return None
        return self._passed_on(seen.birth, seen, call, "returned it", now)

    def _received(
        self,
        seg: Segment,
        call: Call,
        slot: Slot,
        path: str,
        summary: Summary,
        now: float,
        finite: str,
        through: str,
        clean: bool,
    ) -> Alert | None:
        """A non-finite value that came from another rank through a collective: said
        once, where it first arrived (``clean``: nothing was seen before it in the
        step), as not born here; what it spreads to after is neither said nor an
        origin."""
        first = clean and not self.from_elsewhere
        self.from_elsewhere = self.step_tainted = True
        if not first:
            return None
        return Alert(
            seg,
            call.id,
            call.info,
            Phase.FWD,
            slot,
            path,
            summary,
            now,
            f"{finite}: it came from another rank through {through}",
            origin=call,
            received=True,
        )

    def _param_before(
        self,
        call: Call,
        bad: tuple[str, torch.Tensor | None, bool | None],
        seg: Segment,
        now: float,
    ) -> Alert | None:
        """A parameter already non-finite when its module ran, with no origin found
        before it: it turned so where nothing was recorded (a step that --every or
        --steps skipped, or before the recording began), or, every step recorded,
        outside the optimizer (the script, another process). Named once, as the place to
        look; later non-finite values are spread from it."""
        name, param, shard = bad
        if self.alerts or self.unrecorded_in is not None or self.from_elsewhere or param is None:
            if param is not None and not self.from_elsewhere:  # spread from what was said:
                self.unrecorded_in = seg.id  # so are the weights after this step's update
            return None
        self.unrecorded_in = seg.id
        where = " in this rank's shard of it" if shard else ""
        how = (
            f"it was already non-finite{where} when the module ran, and finite after the "
            "last optimizer step: something outside the optimizer changed it between "
            "the steps (the script, a hook, another process)"
            if self.watched
            else f"it was already non-finite{where} when the module ran: it became so "
            "where nothing was recorded (a step --every or --steps skipped, or before the "
            "recording began); record every step to find where it was born"
        )
        return Alert(
            seg,
            call.id,
            call.info,
            Phase.FWD,
            Slot.PARAM,
            name,
            summarise(param.detach()),
            now,
            how,
            origin=call,
        )

    def _passed_on(
        self, birth: Alert | None, seen: SeenTensor, call: Call, how: str, now: float
    ) -> Alert | None:
        """Report an inf's birth once it proved to be no mask (it was passed on)."""
        call.tainted = True
        if birth is None or birth.reported:
            return None
        birth.reported = seen.alerted = True
        if birth.origin is not call:
            birth.note += f"; {call.info.name} {how}"
        birth.time = now
        return birth

    # -- backward ---------------------------------------------------------------------

    def gradient(
        self,
        seen: SeenTensor,
        summary: Summary,
        seg: Segment,
        now: float,
        after: Call | None = None,
    ) -> Alert | None:
        """The gradient w.r.t. the tensor of ``seen`` is non-finite; ``after``: the call
        whose backward ran last before it in this pass (the module on the far side of
        tensor code the gradient came through)."""
        consumers = [(c, p) for c, slot, p in seen.slots() if slot == Slot.GRAD_INPUT]
        producers = [(c, p) for c, slot, p in seen.slots() if slot == Slot.GRAD_OUTPUT]
        for c, _ in producers:
            c.bad_grad = True
            c.mark_below_bad()
        # a call that already had NaN in its forward (inputs, or itself) passes it on
        candidates = [
            (c, p) for c, p in consumers if not (c.bad_grad or c.below_bad or c.nan_in or c.tainted)
        ]
        if candidates:
            self.step_tainted = True
            call, path = max(candidates, key=lambda cp: cp[0].depth)
            call.mark_below_bad()
            return Alert(
                seg,
                call.id,
                call.info,
                Phase.BWD,
                Slot.GRAD_INPUT,
                path,
                summary,
                now,
                "the gradients w.r.t. its outputs were finite",
                origin=call,
            )
        birth = seen.birth
        if birth is not None and not birth.reported and not seen.alerted and not consumers:
            # an inf in the forward value (a mask, so far) made this gradient non-finite
            seen.alerted = birth.reported = True
            self.step_tainted = True
            birth.note += "; it made the gradients non-finite in the backward pass"
            birth.time = now
            return birth
        if not consumers and producers and self._unknown_provenance_ok():
            call, path = min(producers, key=lambda cp: cp[0].depth)
            name = f"{call.info.name} ({call.info.type})"
            if after is None:
                where = f"the loss computation after {name}"
            else:
                where = f"tensor code between {name} and {after.info.name} ({after.info.type})"
            return Alert(
                seg,
                call.id,
                call.info,
                Phase.BWD,
                Slot.GRAD_OUTPUT,
                path,
                summary,
                now,
                f"it feeds no module, and the gradients before it were finite: it was born "
                f"in the backward pass of {where}",
                origin=call,
            )
        self.step_tainted = True
        return None

    def param_grad(
        self,
        info: ModuleInfo,
        calls: list[Call],
        name: str,
        summary: Summary,
        seg: Segment,
        now: float,
    ) -> Alert | None:
        self.step_tainted = True
        if any(c.bad_grad or c.below_bad or c.nan_in or c.tainted for c in calls):
            return None
        origin = calls[-1] if calls else None
        if origin is not None:
            origin.mark_below_bad()
        return Alert(
            seg,
            origin.id if origin else -1,
            info,
            Phase.BWD,
            Slot.PARAM_GRAD,
            name,
            summary,
            now,
            "the gradients w.r.t. its outputs were finite",
            origin=origin,
        )

    # -- the loss ---------------------------------------------------------------------

    def loss(
        self, site: ModuleInfo, summary: Summary, seg: Segment, model: Call | None, now: float
    ) -> Alert | None:
        """What a backward pass starts from (recorder/hooks/backward.py) is non-finite. An
        origin unless a problem was already seen in the step: then it spread there."""
        if self.step_tainted:
            return None
        self.step_tainted = True
        after = (
            f"after {model.info.name} ({model.info.type})"
            if model is not None
            else "(no recorded module ran before it)"
        )
        return _loss_alert(
            site,
            summary,
            seg,
            now,
            "every module output of the step was finite: it was born in the loss "
            f"computation {after}",
        )

    def unrecorded_loss(
        self, site: ModuleInfo, summary: Summary, seg: Segment, weights: list[str], now: float
    ) -> Alert | None:
        """The loss of a step whose module calls are not checked (not recorded, or below
        --level stats) is non-finite: where it was born is unknown, but whether the
        weights already were is known.
        (Not asked when the loss before it was non-finite too: the same problem.)"""
        alert = _loss_alert(
            site,
            summary,
            seg,
            now,
            f"in a step whose module calls were not checked, so where it was born is "
            f"unknown; {weights_note(weights)}",
        )
        alert.unchecked = True
        return alert

    # -- optimizer and ranks ----------------------------------------------------------

    def reduced_grad(
        self, info: ModuleInfo, name: str, summary: Summary, seg: Segment, now: float
    ) -> Alert | None:
        """The gradient the optimizer step uses is non-finite, but this rank's own was
        finite: it came from another rank through the all-reduce (one alert a step)."""
        if not self._unknown_provenance_ok():
            return None
        return Alert(
            seg,
            -1,
            info,
            Phase.OPT,
            Slot.STEP_GRAD,
            name,
            summary,
            now,
            "this rank's own gradient was finite: it came from another rank through the all-reduce",
            received=True,
        )

    def param_value(
        self,
        info: ModuleInfo,
        opt: ModuleInfo,
        call: int,
        name: str,
        summary: Summary,
        grad_finite: bool | None,
        seg: Segment,
        now: float,
    ) -> Alert | None:
        self.step_tainted = True
        if grad_finite is False or self.unrecorded_in == seg.id:
            return None
        grad = "its gradient was finite" if grad_finite else "it had no gradient this step"
        return Alert(
            seg,
            call,
            info,
            Phase.OPT,
            Slot.PARAM,
            name,
            summary,
            now,
            f"after {opt.name}.step(); {grad}",
        )


def _from_outside(call: Call, path: str, summary: Summary, seg: Segment, now: float) -> Alert:
    """Input ``path`` of ``call`` held a value no recorded module produced."""
    where = "the data" if call.parent is None else "tensor code between modules"
    return Alert(
        seg,
        call.id,
        call.info,
        Phase.FWD,
        Slot.INPUT,
        path,
        summary,
        now,
        f"no recorded module produced it: it came from {where}",
        origin=call,
    )


def _received_birth(call: Call) -> Alert | None:
    """Where the infs that ``call`` received were born."""
    for _, seen in call.inf_inputs or ():
        if seen.birth is not None:
            return seen.birth
    return None


def _nonfinite_param(module: object, call: Call) -> tuple[str, torch.Tensor, bool | None] | None:
    """A non-finite parameter of ``module``, if any: a module computing with non-finite
    weights spreads an earlier NaN; it is no origin itself. The third value says whether
    this rank's own shard of it holds the non-finite value: under FSDP2 (over tensor
    parallel too) False when it came from another rank's shard through the all-gather;
    True for another DTensor (its local shard was read); None for a parameter held
    whole."""
    if not isinstance(module, torch.nn.Module):
        return None
    with torch.no_grad():
        for name, p in module.named_parameters(recurse=False):
            v = local(p)  # a DTensor's own shard: reading it whole would run collectives
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                # FSDP2 gathers a tensor-parallel piece over its data-parallel ranks:
                # the local tensor of the gathered DTensor is not this rank's own shard
                own = _own_shard_bad(module, name, call)
                if own is None and v is not p:
                    own = True  # another DTensor: its local shard is this rank's own
                return name, p, own
    return None


def _own_shard_bad(module: torch.nn.Module, name: str, call: Call) -> bool | None:
    """Under FSDP2, whether this rank's shard of ``module``'s gathered parameter
    ``name`` is non-finite; None when no enclosing call's module shards it. FSDP2 keeps
    its parameters out of its public API: any change there gives None, the answer
    without sharding."""
    try:
        at: Call | None = call
        while at is not None:
            state = getattr(at.info.ref(), "_get_fsdp_state", None)
            group = state()._fsdp_param_group if state is not None else None
            for fp in group.fsdp_params if group is not None else ():
                info = fp._module_info
                if info.module is module and info.param_name == name:
                    return not bool(torch.isfinite(local(fp.sharded_param)).all())
            at = at.parent
    except Exception:
        return None
    return None


def nonfinite_weights(registry: ModuleRegistry) -> list[str]:
    """The parameters of the modules seen holding NaN/inf (this rank's shard of a
    DTensor), by full name: read when a value turns non-finite where nothing was checked."""
    found = []
    with torch.no_grad():
        for info in registry.infos:
            if info.kind != ModuleKind.MODULE:
                continue
            module = info.ref()
            if not isinstance(module, torch.nn.Module):
                continue
            for name, p in module.named_parameters(recurse=False):
                v = local(p)
                if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                    found.append(f"{info.name}.{name}")
    return found


def weights_note(weights: list[str]) -> str:
    """What the weights were when a value was found non-finite where nothing was
    checked (``nonfinite_weights``: this rank's shards; on several ranks, where those
    were finite, it may have come from another rank)."""
    if not weights:
        group = initialized_process_group()
        if group is not None and group[1] > 1:
            return "this rank's weights were finite then (it may have come from another rank)"
        return "every weight was finite then"
    more = f" and {len(weights) - 3} more" if len(weights) > 3 else ""
    return f"these weights already held NaN/inf: {', '.join(weights[:3])}{more}"


def _loss_alert(site: ModuleInfo, summary: Summary, seg: Segment, now: float, why: str) -> Alert:
    """An alert on what a backward pass started from (no call: the loss site's)."""
    return Alert(seg, -1, site, Phase.FWD, Slot.LOSS, "", summary, now, why)
