"""A zoo model's step results compared: path against path, against eager, and saved for paths run apart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .zoo_paths import EAGER, GUARDED, ZooPath
from .zoo_records import ModelResult, PathResult


def _difference(a: list[Any], b: list[Any]) -> float | None:
    """The largest absolute difference between two steps' results (0.0: bitwise equal); None where they do not
    even have the same tensors."""
    worst = 0.0
    if len(a) != len(b):
        return None
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if (x is None) != (y is None):
                return None
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return None
        if not (x.isnan() == y.isnan()).all():
            return float("inf")
        if not x.equal(y):
            worst = max(worst, float((x.double() - y.double()).abs().nan_to_num(0.0).max()))
    return worst


def _both_have(a: list[Any], b: list[Any]) -> tuple[list[Any], list[Any]]:
    """The results of ``a`` and ``b`` that are tensors of the same shape and dtype on both sides, paired (none
    where the two do not have as many results)."""
    if len(a) != len(b):
        return [], []
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if _same_kind(x, y)]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _same_kind(x: Any, y: Any) -> bool:
    return x is not None and y is not None and x.shape == y.shape and x.dtype == y.dtype


def _mismatch(a: list[Any], b: list[Any], names: Sequence[str]) -> str:
    """Which result of ``a`` has no counterpart of the same kind in ``b`` (``names``: what each result is)."""
    if len(a) != len(b):
        return f"{len(a)} results, not {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        name = names[i] if i < len(names) else f"result {i}"
        if (x is None) != (y is None):
            return f"{name} is {'None' if x is None else 'a tensor'} here, {'None' if y is None else 'a tensor'} there"
        if x is not None and (x.shape != y.shape or x.dtype != y.dtype):
            return f"{name} is {tuple(x.shape)} {x.dtype} here, {tuple(y.shape)} {y.dtype} there"
    return "the same tensors"


def _against_eager(guarded: list[Any], eager: list[Any], names: Sequence[str] = ()) -> str:
    """How a path's results compare with eager's: bitwise, within ``torch.testing.assert_close``'s tolerance for
    their dtype (what Thunder's own tests compare with), or not; ``names`` says what each result is."""
    import torch

    if _difference(guarded, eager) is None:
        # The tensors both have are still compared: a path that loses one gradient must not hide a wrong loss.
        mine, theirs = _both_have(guarded, eager)
        rest = _against_eager(mine, theirs).replace(" to eager", "").replace("eager's ", "") if mine else "none"
        return f"different tensors from eager ({_mismatch(guarded, eager, names)}); the tensors both have: {rest}"
    try:
        for a, b in zip(guarded, eager, strict=True):
            if a is not None:
                torch.testing.assert_close(a, b)
    except AssertionError:
        return f"outside eager's tolerance (max abs difference {_difference(guarded, eager):.3g})"
    return "bitwise equal to eager" if _difference(guarded, eager) == 0.0 else "within eager's tolerance"


def save_values(out: Path, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]) -> None:
    """Each path's step results (on the CPU) and what each result is, to ``out`` (read by :func:`load_values`)."""
    import torch

    def cpu(x: Any) -> Any:
        return None if x is None else x.cpu()

    saved = {p.name: {"names": names[p], "values": [cpu(x) for x in v]} for p, v in values.items()}
    torch.save(saved, out)


def load_values(out: Path) -> tuple[dict[ZooPath, list[str]], dict[ZooPath, list[Any]]]:
    """What :func:`save_values` saved: ({}, {}) where the process saved nothing (it failed or timed out first)."""
    import torch

    if not out.exists():
        return {}, {}
    saved = torch.load(out, weights_only=True)
    paths = {ZooPath.parse(name): entry for name, entry in saved.items()}
    return {p: e["names"] for p, e in paths.items()}, {p: e["values"] for p, e in paths.items()}


def _compare(result: ModelResult, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]) -> None:
    """Each guarded path's results against its baseline's (:func:`compare_with_baselines`; eager's where unguarded
    Thunder failed), and each unguarded Thunder path's against eager's. ``names``: what each result of a path is."""
    compared = compare_with_baselines(result, names, values)
    for path in GUARDED:
        if path in values and path not in compared and path.baseline is not None and EAGER in values:
            _compare_with_eager(result.paths[path], values[path], values[EAGER], names[path])  # Thunder failed
    for path in values:  # unguarded Thunder against eager: where it differs itself
        row = result.paths[path]
        if path.is_baseline and EAGER in values and row.bits is None:
            _compare_with_eager(row, values[path], values[EAGER], names[path])


def compare_with_baselines(
    result: ModelResult, names: dict[ZooPath, list[str]], values: dict[ZooPath, list[Any]]
) -> set[ZooPath]:
    """Each guarded path's results against its baseline's (the one without CUDA graphs where that did not run),
    the baseline's own run-to-run difference as the floor; the guarded paths so compared. Also across processes:
    the values of paths run apart (:func:`load_values`). Where the guarded path differs from its baseline, or
    its twin with CUDA graphs failed (the guard rescued the capture), how it compares with eager follows (from
    eager's values where given, else from the comparison its own process made): a guarded path that differs
    from a wrong unguarded Thunder says so."""
    compared = set()
    for path in GUARDED:
        baseline = path.baseline
        if path not in values or baseline is None:
            continue
        if baseline not in values and baseline.cudagraphs:  # unguarded CUDA graphs did not run
            baseline = replace(baseline, cudagraphs=False)
        if baseline not in values:
            continue
        row = result.paths[path]
        own_eager = row.bits if row.compared_with == EAGER else None  # what its own process compared
        row.compared_with, row.difference = baseline, _difference(values[path], values[baseline])
        floor = result.paths[baseline].self_difference
        if row.difference is None:  # the tensors both have are still compared
            mine, theirs = _both_have(values[path], values[baseline])
            rest = _against_twin(_difference(mine, theirs), floor) if mine else "none"
            row.bits = f"different tensors ({_mismatch(values[path], values[baseline], names[path])}); "
            row.bits += f"the tensors both have: {rest}"
        else:
            row.bits = _against_twin(row.difference, floor)
        rescued = baseline != path.baseline
        if rescued or not row.bits.startswith(("bitwise", "within")):
            if EAGER in values:
                own_eager = _against_eager(values[path], values[EAGER], names[path])
            if own_eager:
                row.bits = f"{row.bits} vs {baseline}; {own_eager}"
        compared.add(path)
    return compared


def _against_twin(difference: float | None, floor: float | None) -> str:
    """A guarded path's difference from its unguarded twin, against the twin's own run-to-run difference."""
    if difference == 0.0:
        return "bitwise"
    if difference is not None and floor is not None and difference <= floor:
        return "within Thunder's own difference"
    return "differs"


def _compare_with_eager(row: PathResult, got: list[Any], eager: list[Any], names: Sequence[str]) -> None:
    row.compared_with, row.difference = EAGER, _difference(got, eager)
    row.bits = _against_eager(got, eager, names)
