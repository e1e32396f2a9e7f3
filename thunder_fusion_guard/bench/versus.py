"""One benchmark case under guarded Thunder and what a user would pick instead (torch.compile by default),
profiled side by side: where the time goes, and where the guard loses (``fusion-guard bench versus``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .cases import BenchCase, compile_variant, step_of

if TYPE_CHECKING:
    from ..examine.versus import SideBySide

DEFAULT_VERSUS = "guarded,inductor"


def versus(
    case: BenchCase,
    variants: Sequence[str],
    device: str,
    *,
    rounds: int = 10,
    profiled: int = 3,
    log: Callable[[str], None] = lambda message: None,
) -> SideBySide:
    """Compile ``case`` as each variant, call each once, then time and profile them side by side; the
    :class:`..examine.versus.SideBySide` (its table, findings, JSON and HTML)."""
    from ..examine.versus import side_by_side

    steps, compiled = {}, {}
    for variant in variants:
        log(f"bench versus: {case.name}: compiling {variant}")
        workload = case.build(device)
        fn = compile_variant(workload, variant, device)
        steps[variant] = step_of(workload, fn, variant, device, sync=False)
        compiled[variant] = fn
        steps[variant]()
    log(f"bench versus: {case.name}: timing and profiling {', '.join(variants)}")
    return side_by_side(case.name, steps, compiled, rounds=rounds, profiled_rounds=profiled, device=device)
