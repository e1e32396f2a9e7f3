"""Which backend runs each ThunderFX subgraph, chosen by measurement: Thunder (with its transforms, the guard
among them), Inductor, or eager PyTorch.

ThunderFX hands every piece of a Dynamo graph that Thunder supports to Thunder. A piece can gain nothing from
it: Thunder's per-call host path may cost more than its fusions save, most of all where graph breaks cut a
model into many small pieces. :func:`choose_backends` times each Thunder subgraph, forward and backward, on
copies of the inputs of one real call, against the same fx graph compiled by Inductor (as ThunderFX compiles
the pieces Thunder does not support) and run eagerly, interleaved, and hands it to the fastest when that
beats Thunder by ``margin``. Only end-to-end times decide (lightning-thunder #1968: per-graph kernel times
disagreed with the step). Thunder 0.2.6's ``thunder.dynamo.thunder_optimize`` makes this choice per whole
Dynamo graph, and without the program's own Thunder options; this makes it per split subgraph.

Inductor and eager compute with other bits than Thunder (within the dtype's tolerance), so nothing here runs
by default: a program calls :func:`choose_backends` itself, after a first call or with its inputs.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

import torch

from . import _thunder as th
from .cost import Measured
from .fx_rescue import compile_fx_module, copy_input, updated_inputs
from .measure.breakeven import SPLIT_REPS
from .measure.timing import first_two_apart, host_device_us, interleaved_us
from .options import seconds_option
from .policy import dearer_on_device
from .reasons import OPTION_NAMES
from .report import backend_choice_line
from .whole_graph import (
    OPTION_COMPILES_S,
    WHOLE_GRAPH_OPTIONS,
    WholeGraphRun,
    forward_backward_step,
    whole_or_split,
)
from .wording import error_line

log = logging.getLogger(__name__)

BACKENDS = ("thunder", "inductor", "eager")
WARMUP = 2


@dataclass
class BackendChoice:
    """The backend chosen for one ThunderFX subgraph, the median µs of a forward (and backward) of each
    backend timed, and why; ``problems`` names a backend that could not run it; ``in_place``: the positions
    of the inputs a run updates in place (such a subgraph is kept on Thunder, untimed)."""

    subgraph: str
    chosen: str
    reason: str
    times_us: dict[str, float] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    backward: bool = False
    in_place: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return backend_choice_line(self.to_dict())


def choose_backends(
    compiled: Any,
    *args: Any,
    backends: Iterable[str] = BACKENDS,
    margin: float = 0.1,
    rounds: int = 10,
    guard: Any = None,
    whole_graphs: bool = False,
    option_compiles_s: float = OPTION_COMPILES_S,
    **kwargs: Any,
) -> list[BackendChoice]:
    """Time every Thunder subgraph of the ThunderFX object ``compiled`` under each of ``backends`` on the
    inputs it receives from ``compiled(*args, **kwargs)`` (one call per subgraph), and run each from now on by
    the fastest, where that beats Thunder by ``margin``. A subgraph a backend was chosen for before is left as
    it is; none is timed where ThunderFX compiled no Thunder subgraph. ``whole_graphs``: first each Dynamo graph is
    timed whole, Inductor's compile of all of it against its split as ThunderFX runs it (a split into many pieces
    costs a call each, and the pieces Thunder does not support run apart), and Inductor runs it where that beats
    the split by ``margin``; the pieces of such a graph are then not timed; a graph that updates its inputs in place
    is not timed. Inductor's compiles of a graph with its options stop once they have taken ``option_compiles_s``
    seconds (the one under way finishes).

    ``guard`` (a ``FusionGuard`` in ``compiled``'s transforms) gets the choices in ``report.backend_choices``.
    Returns one :class:`BackendChoice` per subgraph timed.
    """
    if not th.is_thunderfx(compiled):
        raise TypeError(f"choose_backends: {type(compiled).__name__} is not a thunderfx(...) object")
    backends = _checked_backends(backends)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"choose_backends option 'margin' must be a number in [0, 1), got {margin!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"choose_backends option 'rounds' must be a whole number >= 1, got {rounds!r}")
    if not isinstance(whole_graphs, bool):
        raise ValueError(f"choose_backends option 'whole_graphs' must be True or False, got {whole_graphs!r}")
    option_compiles_s = seconds_option("option_compiles_s", option_compiles_s, owner="choose_backends")
    if not _still_thunder(th.thunderfx_subgraphs(compiled)):
        compiled(*args, **kwargs)  # compiles
    # Whole graphs first: a graph Inductor runs whole no longer calls its pieces, so none of them is compiled by
    # Inductor and timed for nothing (its split timed as ThunderFX runs it; a graph kept split stays so, as the
    # choices below only make its pieces faster).
    choices = _whole_graphs(compiled, args, kwargs, margin, rounds, option_compiles_s) if whole_graphs else []
    # One at a time, in the order they were made, each on the inputs of a call made after the choices before it:
    # the backend chosen for one subgraph can hand the next its tensors in other strides, which Inductor checks.
    for sub in _still_thunder(th.thunderfx_subgraphs(compiled)):
        inputs = _record_inputs(compiled, [sub], args, kwargs).get(sub.label)
        if isinstance(inputs, str):
            reason = f"kept on Thunder: its inputs could not be copied to time it ({inputs})"
            choices.append(BackendChoice(sub.label, "thunder", reason, problems={"copy": inputs}))
        elif inputs is not None:
            choices.append(_choose(sub, inputs, backends, margin, rounds))
    if guard is not None:  # sharing each choice's problems: a later failure on a call shows in the report too
        guard.report.backend_choices += [{**c.to_dict(), "problems": c.problems} for c in choices]
    return choices


def _checked_backends(backends: Iterable[str]) -> tuple[str, ...]:
    chosen = (backends,) if isinstance(backends, str) else tuple(backends)
    if "thunder" not in chosen or any(b not in BACKENDS for b in chosen):
        raise ValueError(
            f"choose_backends option 'backends' must name 'thunder' and any of {list(BACKENDS[1:])}, got {backends!r}"
        )
    return chosen


def _still_thunder(subs: Sequence[th.FxSubgraph]) -> list[th.FxSubgraph]:
    return [s for s in subs if s.owner is not None and getattr(s.owner, s.name, None) is s.jitted]


class _Runner(torch.nn.Module):
    """What a split GraphModule calls instead of a Thunder subgraph: a function, as a module."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class _Chosen(torch.nn.Module):
    """The backend chosen for a subgraph; should it ever fail on a call, the subgraph goes back to Thunder for
    good (a warning and ``choice.problems`` say so), so that the choice never breaks the program."""

    def __init__(self, backend: Any, sub: th.FxSubgraph, choice: BackendChoice) -> None:
        super().__init__()
        self.backend, self.thunder = backend, sub.jitted
        self._sub, self._choice = sub, choice

    def forward(self, *args: Any) -> Any:
        try:
            return self.backend(*args)
        except Exception as e:  # a backend's failure of any kind sends the subgraph back to Thunder; the call goes on
            problem = error_line(e)
            self._choice.problems[self._choice.chosen] = f"failed on a call, back on Thunder: {problem}"
            warnings.warn(
                f"choose_backends: {self._choice.chosen} failed on {self._sub.label} ({problem}); it runs on Thunder "
                "from now on",
                RuntimeWarning,
                stacklevel=2,
            )
            th.replace_subgraph(self._sub, self.thunder)
            return self.thunder(*args)


def _record_inputs(
    compiled: Any, subs: Sequence[th.FxSubgraph], args: tuple, kwargs: dict
) -> dict[str, list[Any] | str]:
    """Copies of the inputs each subgraph receives in one call of ``compiled`` (tensors detached, each keeping
    whether it requires grad, so that timing a backward touches no real ``.grad``), or why they could not be
    copied."""
    seen: dict[str, list[Any] | str] = {}
    try:
        for sub in subs:
            th.replace_subgraph(sub, _Runner(_recording(seen, sub.label, sub.jitted)))
        compiled(*args, **kwargs)
    finally:
        for sub in subs:
            th.replace_subgraph(sub, sub.jitted)
    return seen


def _recording(seen: dict[Any, list[Any] | str], key: Any, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, keeping copies of the arguments of its first call in ``seen[key]`` (or why they could not be
    copied: the call goes on, and what it runs is then kept as it is, with that reason)."""

    def record(*a: Any) -> Any:
        if key not in seen:
            try:
                seen[key] = [copy_input(x) for x in a]
            except Exception as e:
                seen[key] = error_line(e)
        return call(*a)

    return record


def _choose(
    sub: th.FxSubgraph, inputs: list[Any], backends: tuple[str, ...], margin: float, rounds: int
) -> BackendChoice:
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    runners: dict[str, Any] = {}
    problems: dict[str, str] = {}
    choice = BackendChoice(sub.label, "thunder", "", problems=problems, backward=bool(leaves))
    written = sorted(updated_inputs(sub.module))
    if written:  # a run changes what the next reads; and with grad on, the rescue may run it eagerly already
        choice.in_place = written
        choice.reason = (
            f"kept as it runs: it updates its input{'s' if len(written) > 1 else ''} "
            f"{', '.join(map(str, written))} in place, so runs on one set of inputs differ; not timed"
        )
        return choice
    before = [copy_input(x) for x in inputs]
    for name in ("thunder", *(b for b in backends if b != "thunder")):  # Thunder first: it shows what a run changes
        try:
            runner = _build(name, sub, inputs)
            forward_backward_step(runner, inputs)()
            runners[name] = runner
        except Exception as e:  # a backend may fail in any way on this subgraph: then it is not chosen, no error
            problems[name] = error_line(e)
        if name == "thunder" and "thunder" not in runners:
            choice.reason = "kept on Thunder: it failed when run alone, so it was not timed"
            return choice
        if name == "thunder" and (changed := _updated_in_place(before, inputs)):
            # Run again, it would read the values its last run wrote (an index that grows past its table, say).
            choice.in_place = changed
            choice.reason = (
                f"kept on Thunder: it updates its input{'s' if len(changed) > 1 else ''} "
                f"{', '.join(map(str, changed))} in place, so runs on one set of inputs differ; not timed"
            )
            return choice
    names = list(runners)
    samples = interleaved_us([forward_backward_step(runners[n], inputs) for n in names], (), reps=rounds, warmup=WARMUP)
    choice.times_us = {n: round(median(s), 3) for n, s in zip(names, samples, strict=True)}
    best = min(choice.times_us, key=choice.times_us.__getitem__)
    thunder_us, best_us = choice.times_us["thunder"], choice.times_us[best]
    timed = ", ".join(f"{n} {us:.1f} µs" for n, us in choice.times_us.items())
    what = "forward and backward" if leaves else "forward"
    if best != "thunder" and best_us < thunder_us * (1 - margin):
        choice.chosen = best
        choice.reason = f"{best} is faster by {1 - best_us / thunder_us:.0%} ({what}: {timed}; margin {margin:.0%})"
        th.replace_subgraph(sub, _Chosen(runners[best], sub, choice))
    else:
        choice.reason = f"kept on Thunder ({what}: {timed}; another backend must be faster by {margin:.0%})"
    return choice


def _updated_in_place(before: list[Any], after: list[Any]) -> list[int]:
    """The positions of the tensors whose values a run changed (``before``: copies taken ahead of it)."""
    return [
        i
        for i, (b, a) in enumerate(zip(before, after, strict=True))
        if isinstance(a, torch.Tensor) and not torch.equal(b.detach(), a.detach())
    ]


def _build(name: str, sub: th.FxSubgraph, inputs: list[Any]) -> Any:
    return sub.jitted if name == "thunder" else compile_fx_module(sub.module, inputs, name)


def _back_to_split(choice: BackendChoice, error: Exception) -> None:
    """Say that Inductor failed on a call of the graph ``choice`` chose it for, which its split runs from now on."""
    problem = error_line(error)
    choice.problems["inductor"] = f"failed on a call, back to the split: {problem}"
    warnings.warn(
        f"choose_backends: Inductor failed on {choice.subgraph} ({problem}); ThunderFX's split runs it from now on",
        RuntimeWarning,
        stacklevel=3,
    )


def _whole_graphs(
    compiled: Any, args: tuple, kwargs: dict, margin: float, rounds: int, option_compiles_s: float
) -> list[BackendChoice]:
    """Each Dynamo graph of ``compiled`` timed as ThunderFX runs it now (its split, each piece on the backend
    chosen for it) against Inductor's compile of the whole graph, and run by Inductor where that is faster by
    ``margin`` (the split GraphModule's forward replaced; a graph chosen so before is left as it is)."""
    infos = list(getattr(compiled, "_backend", compiled).subgraph_infos)
    pending = [(i, info) for i, info in enumerate(infos) if "forward" not in vars(info.split_graph_module)]
    seen: dict[int, list[Any] | str] = {}
    try:
        for index, info in pending:
            split = info.split_graph_module
            split.forward = _recording(seen, index, functools.partial(type(split).forward, split))
        compiled(*args, **kwargs)
    finally:
        for _, info in pending:
            vars(info.split_graph_module).pop("forward", None)
    return [
        _choose_whole(index, info, seen[index], margin, rounds, option_compiles_s)
        for index, info in pending
        if index in seen
    ]


def _choose_whole(
    index: int, info: Any, inputs: list[Any] | str, margin: float, rounds: int, option_compiles_s: float
) -> BackendChoice:
    label = f"{th.dynamo_graph_label(index)} (whole)"
    problems: dict[str, str] = {}
    choice = BackendChoice(label, "split", "", problems=problems)
    if isinstance(inputs, str):
        choice.reason = f"kept split: its inputs could not be copied to time it ({inputs})"
        return choice

    def timer(
        split_step: Callable[[], None], whole_step: Callable[[], None], args: tuple, apart: bool = False
    ) -> Measured:
        # no spread given: the margin asked for holds as it is; host and device apart where asked (CUDA), for the
        # rule that keeps an option of Inductor's only where the device does not pay for it
        samples = interleaved_us([split_step, whole_step], args, reps=rounds, warmup=WARMUP)
        split_us, whole_us = (round(median(s), 3) for s in samples)
        found = None
        if apart:
            try:
                found = host_device_us([split_step, whole_step], args, reps=SPLIT_REPS, cuda=True)
            except Exception as e:  # timing host and device apart may fail in any way: the timing still decides
                log.debug("choose_backends: host and device not timed apart: %s", e)
        host, device = first_two_apart(found)
        return Measured(split_us, whole_us, "timed", host=host, device=device)

    split = info.split_graph_module
    found = whole_or_split(label, info.original_graph_module, split, inputs, timer, margin, option_compiles_s)
    if found.in_place:
        choice.in_place = found.in_place
        choice.reason = f"kept split: {found.why}"
        return choice
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    choice.backward = bool(leaves)
    if found.measured is None:  # Inductor failed on the whole graph: then the split stays, no error
        problems["inductor"] = found.error
        choice.reason = "kept split: Inductor failed on the whole graph"
        return choice
    split_us, whole_us = found.measured.region_us, found.measured.eager_us
    choice.times_us = {"split": split_us, "inductor": whole_us}
    what = "forward and backward" if leaves else "forward"
    timed = f"split {split_us:.1f} µs, Inductor whole {whole_us:.1f} µs"
    tried = [  # Inductor's options timed after its default compile: (name, timing, why not timed, runs the graph)
        (
            OPTION_NAMES.get(option.runs, "all options"),
            getattr(found, option.timed),
            getattr(found, option.why),
            getattr(found, option.runs) and option.runs in OPTION_NAMES,  # all options: each it runs is named
        )
        for option in WHOLE_GRAPH_OPTIONS
    ]
    for option, option_timed, why, runs in tried:
        if option_timed is not None:
            choice.times_us[f"inductor with {option}"] = option_timed.eager_us
            timed += f", with {option} {option_timed.eager_us:.1f} µs"
            if option_timed.device is not None:
                before, after = option_timed.device
                timed += f" ({after:.1f} on the device against {before:.1f})"
                if not runs and dearer_on_device(option_timed):
                    problems[f"inductor with {option}"] = "dearer on the device, so not taken"
        elif why:
            problems[f"inductor with {option}"] = why
    if found.inductor and found.whole is not None:
        options = [option for option, _, _, runs in tried if runs]
        choice.chosen = "inductor" + (f" with {' and '.join(options)}" if options else "")
        choice.reason = f"Inductor runs the whole graph: faster by {1 - whole_us / split_us:.0%} ({what}: {timed})"
        split.forward = WholeGraphRun(found.whole, split, functools.partial(_back_to_split, choice))
    else:
        choice.reason = f"kept split ({what}: {timed}; Inductor must be faster by {margin:.0%})"
    return choice
