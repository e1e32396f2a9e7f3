"""One zoo model in its own process: its paths compiled, run, compared and timed (``run_model``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..wording import error_line, error_text
from .zoo_paths import GUARDED, ZooPath
from .zoo_records import ModelResult, PathResult, Rescue
from .zoo_values import _compare, _difference, save_values

COMPILE_MARGIN = 1.3  # a Thunder path's compile is guessed as this times the longest one so far
SELF_REPEATS = 3  # extra steps of each unguarded path: Thunder's own run-to-run difference is their largest
LOCK_ENV = "TFG_ZOO_LOCK"


@dataclass(frozen=True)
class ModelSpec:
    """What one model's process runs (as one JSON argument): the model, device and paths, ``rounds`` timed rounds
    until ``deadline`` (``time.time()``), the result file ``out``, torch's intra-op ``threads`` (0: its default),
    the guard's options, whether the library ops are translated first, and where to save the step results."""

    model: str
    device: str
    paths: tuple[ZooPath, ...]
    rounds: int
    deadline: float
    out: str
    threads: int = 0
    guard_options: dict[str, Any] | None = None
    translate: bool = False
    values_out: str = ""  # where to save each path's step results (for comparing paths run in other processes)

    def to_json(self) -> str:
        """The spec as JSON, paths by name."""
        return json.dumps({**self.__dict__, "paths": [p.name for p in self.paths]})

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """Read back from :meth:`to_json`."""
        d = json.loads(text)
        return cls(**{**d, "paths": tuple(ZooPath.parse(p) for p in d["paths"])})


def _compile(
    module: Any, path: ZooPath, device: str, guard_options: dict[str, Any] | None = None
) -> tuple[Callable[..., Any], Any]:
    """``module`` compiled as ``path``, and the FusionGuard (made with ``guard_options``) it runs with (None for
    unguarded paths). CUDA graphs: ``GuardedCUDAGraphs`` beside the guard, Thunder's ``CUDAGraphTransform`` alone."""
    import torch

    if path.frontend == "eager":
        return module, None
    if not path.is_thunder:
        return torch.compile(module, mode="reduce-overhead" if path.frontend == "inductor-ro" else None), None
    import thunder
    from thunder.dynamo import thunderfx
    from thunder.transforms.cudagraph import CUDAGraphTransform

    from .._thunder import fusion_executors
    from ..cuda_graphs import GuardedCUDAGraphs
    from ..transform import FusionGuard

    guard = FusionGuard(**(guard_options or {})) if path.guarded else None
    graphs = (GuardedCUDAGraphs() if guard else CUDAGraphTransform()) if path.cudagraphs else None
    transforms = ([guard] if guard else []) + ([graphs] if graphs else [])
    jit = thunderfx if path.frontend == "ThunderFX" else thunder.jit
    return jit(module, executors=fusion_executors(device), transforms=transforms), guard


@contextlib.contextmanager
def file_lock(env: str) -> Iterator[None]:
    """An exclusive lock on the file the environment variable ``env`` names, held for the block (processes started
    side by side share it: one at a time); where ``env`` names none, a no-op."""
    path = os.environ.get(env)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _timing_alone() -> contextlib.AbstractContextManager[None]:
    """With ``--jobs`` above one, models compile side by side but are timed one at a time (an exclusive lock on a
    file the models share; other models may still be compiling on other cores meanwhile); one job: a no-op."""
    return file_lock(LOCK_ENV)


class _Step:
    """One training step of a zoo model through a compiled callable: forward, loss, backward."""

    def __init__(self, model: Any, fn: Callable[..., Any], device: str) -> None:
        import torch

        self.model, self.fn, self.cuda = model, fn, device == "cuda"
        named = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.leaves = [x for x in model.inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        inputs = [i for i, x in enumerate(model.inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
        # What each of values() is, for saying which differs.
        self.names = [
            "the loss",
            *(f"the gradient of {n}" for n, _ in named),
            *(f"the gradient of input {i}" for i in inputs),
        ]
        self.loss: Any = None

    def once(self) -> Any:
        """The step's work alone (what a whole-step CUDA graph captures): gradients set to None, forward, loss,
        backward; returns the loss, detached."""
        for t in (*self.params, *self.leaves):
            t.grad = None
        loss = self.model.loss(self.fn(*self.model.inputs))
        loss.backward()
        # Detached: a loss kept with its graph keeps the step's gradient accumulators alive, and every later step
        # on the same parameters (another path's, a captured one) would accumulate on the stream they were made on.
        return loss.detach()

    def __call__(self) -> None:
        import torch

        self.loss = self.once()
        if self.cuda:
            torch.cuda.synchronize()

    def values(self) -> list[Any]:
        """The step's results: its loss and every gradient, copied."""
        return [self.loss.detach().clone()] + [
            None if t.grad is None else t.grad.detach().clone() for t in (*self.params, *self.leaves)
        ]


def _why_lines(fn: Any, args: Sequence[Any] = (), limit: int = 3) -> list[str]:
    """The summary and first rows of the why-not-fused report of a compiled Thunder path, where it can be made;
    given ``args`` (on CUDA: one more step, for nvFuser's segments), as ``why_not_fused(fn, *args)``."""
    try:
        from ..examine.why import why_not_fused

        why = why_not_fused(fn, *args)
    except Exception as e:  # a diagnosis failing must not lose the model's numbers
        return [f"why_not_fused failed: {error_line(e)}"]
    return [why.summary(), *str(why).splitlines()[2 : 2 + limit]]


def _save(result: ModelResult, out: Path) -> None:
    """Write ``result`` to ``out`` whole or not at all (a process killed at its time limit leaves the last one)."""
    partial = out.with_name(out.name + ".part")
    partial.write_text(json.dumps(result.to_dict()))
    os.replace(partial, out)


def run_model(spec: ModelSpec, log: Callable[[str], None]) -> ModelResult:
    """Build the zoo model ``spec`` names and run every path on it, writing the result to ``spec.out`` after each
    phase so that a run cut short by its time limit keeps what it measured; with ``spec.translate``, the package's
    translations of library ops are put in place (process-wide) first."""
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    if spec.translate:
        from .._thunder import translate_library_ops

        translate_library_ops()
    out = Path(spec.out)
    result, steps = _compile_paths(
        spec.model, spec.device, spec.paths, out, log, spec.guard_options, spec.deadline, spec.values_out
    )
    with _timing_alone():
        _time_paths(result, steps, spec.rounds, spec.deadline)
    _save(result, out)
    return result


def _compile_paths(
    name: str,
    device: str,
    paths: Sequence[ZooPath],
    out: Path,
    log: Callable[[str], None],
    guard_options: dict[str, Any] | None = None,
    deadline: float | None = None,
    values_out: str = "",
) -> tuple[ModelResult, dict[ZooPath, _Step]]:
    """Compile and run every path on zoo model ``name``: runs, first call, bits against unguarded Thunder, the
    guard's actions and why-not-fused lines. A Thunder path whose compile (guessed from the longest one so far)
    would end past ``deadline`` is not started, so that what compiled is still timed. With ``values_out``, each
    path's step results are saved there (:func:`save_values`)."""
    import torch

    from .._thunder import library_ops_are_translated
    from ..examine.first_call import first_call
    from .zoo_models import ZOO

    torch.manual_seed(0)
    entry = ZOO[name]
    model = entry.build(device)
    result = ModelResult(name, entry.library, entry.what, translated=library_ops_are_translated())
    steps: dict[ZooPath, _Step] = {}
    values: dict[ZooPath, list[Any]] = {}
    longest_thunder = 0.0
    for path in paths:
        row = result.paths[path] = PathResult()
        guess = COMPILE_MARGIN * longest_thunder
        if path.is_thunder and deadline is not None and guess and time.time() + guess > deadline:
            row.error = f"not compiled: its compile (about {guess:.0f} s) would end past the time limit"
            log(f"zoo: {name}: {path} {row.error}")
            _save(result, out)
            continue
        try:
            fn, guard = _compile(model.module, path, device, guard_options)
            step = _Step(model, fn, device)
            timer = first_call(fn) if path.is_thunder else contextlib.nullcontext()
            began = time.perf_counter()
            with timer as first:
                step()
            row.first_call_s = round(time.perf_counter() - began, 3)
            row.phases_s = first.to_dict(3)["phases_s"] if first else None
            if path.backends:
                from ..backend_choice import choose_backends

                chosen = choose_backends(fn, *model.inputs, guard=guard)
                row.backends = dict(Counter(c.chosen for c in chosen))
            step()
            values[path] = step.values()
            if path.is_baseline:  # Thunder against itself: its own run-to-run difference
                repeats = []
                for _ in range(SELF_REPEATS):
                    step()
                    repeats.append(_difference(values[path], step.values()))
                row.self_difference = None if None in repeats else max(repeats)
        except Exception as e:  # one path failing must not lose the others
            row.error = error_line(e)
            if "\n" in str(e).strip():  # nvFuser's asserts say what failed after their first line
                row.error_detail = error_text(e)
            log(f"zoo: {name}: {path} FAILED: {row.error}")
            _save(result, out)
            continue
        row.runs = True
        if path.is_thunder:
            longest_thunder = max(longest_thunder, row.first_call_s)
        steps[path] = step
        if guard is not None:
            row.actions = dict(Counter(d.action for d in guard.report.decisions))
            row.rescues = [Rescue.of(d) for d in guard.report.decisions if d.action == "rescue"]
        log(f"zoo: {name}: {path} runs, first call {row.first_call_s:.1f} s")
        _save(result, out)
    names = {path: step.names for path, step in steps.items()}
    _compare(result, names, values)
    if values_out:
        save_values(Path(values_out), names, values)
    for path in GUARDED:
        if path in steps:
            result.paths[path].why = _why_lines(steps[path].fn, model.inputs if device == "cuda" else ())
    _save(result, out)
    return result, steps


def _time_paths(result: ModelResult, steps: dict[ZooPath, _Step], rounds: int, deadline: float) -> None:
    """Time every path that runs, ``rounds`` rounds in a balanced order, until ``deadline`` (three rounds at
    least, so that a model that waited its turn still gets medians)."""
    from ..measure.timing import interleaved_rounds

    timed = interleaved_rounds(steps, rounds, stop=lambda r: r >= 3 and time.time() > deadline)
    if timed.cut_at is not None:
        result.rounds_cut = timed.cut_at
    for path, samples in timed.samples.items():
        result.paths[path].samples_s = samples
