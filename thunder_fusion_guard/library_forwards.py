"""Forwards of library modules written again in plain torch, for compilers that lose what the library's own does.

e3nn's ``Extract`` (inside ``nn.Gate``) copies slices of its input into new zero tensors in place: Thunder's
gradient of a copy into a slice is lost or fails, and ThunderFX, which splits ``narrow`` off, leaves such a buffer
without autograd history. :func:`write_extract_out_of_place` gives it a forward of slices and ``cat`` (the same
values, out of place); :func:`restore_extract` puts e3nn's own back. Nothing here touches Thunder:
``_thunder/translations.py`` puts these forwards in place with its translations (``translate_library_ops``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from typing import Any, NamedTuple

import torch

__all__ = ["ReplacedForward", "extract_plan", "restore_extract", "write_extract_out_of_place"]


class ReplacedForward(NamedTuple):
    """A library class whose forward and constructor were replaced, and the ones it had."""

    cls: type
    forward: Any
    init: Any


def write_extract_out_of_place() -> ReplacedForward | None:
    """e3nn's ``Extract`` given a forward of slices and ``cat`` and a constructor that makes each new module's plan,
    and every module made before given its plan now (where e3nn is installed): made at the first call instead,
    inside Dynamo, the plan would break the user's graph at each ``Extract``. What it replaced, or None."""
    made_before = "e3nn.nn._extract" in sys.modules
    try:
        from e3nn.nn._extract import Extract
    except Exception:  # no e3nn, or one without this module: nothing to write
        return None
    forward, init = Extract.__dict__.get("forward"), Extract.__dict__.get("__init__")
    if forward is None or init is None:
        return None

    @functools.wraps(init)
    def planned_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        extract_plan(self)

    Extract.forward, Extract.__init__ = _extract_out_of_place, planned_init
    if made_before:
        for obj in gc.get_objects():
            with contextlib.suppress(Exception):  # an object whose class cannot be asked is no Extract
                if isinstance(obj, Extract) and "_tfg_extract_plan" not in obj.__dict__:
                    extract_plan(obj)
    return ReplacedForward(Extract, forward, init)


def restore_extract(replaced: ReplacedForward | None) -> None:
    """Give ``Extract`` back the forward and constructor :func:`write_extract_out_of_place` replaced (modules keep
    their plans, which e3nn's forward does not read)."""
    if replaced is not None:
        replaced.cls.forward, replaced.cls.__init__ = replaced.forward, replaced.init


def _extract_out_of_place(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What e3nn's ``Extract.forward`` returns (each output a copy of slices of ``x``, zeros where it has none),
    built from slices and ``cat`` instead of copies into new zero tensors."""
    plan = self.__dict__.get("_tfg_extract_plan")
    if plan is None:
        plan = extract_plan(self)
    outputs = []
    for whole, dim, spans in plan:
        if whole:
            outputs.append(x.clone())
        elif spans:
            outputs.append(torch.cat([x[..., a:b] for a, b in spans], dim=-1))
        else:
            outputs.append(x.new_zeros((*x.shape[:-1], dim)))
    return tuple(outputs)


@torch.compiler.disable  # Dynamo cannot guard on e3nn's Irreps; made with the module, or here outside any tracing
def extract_plan(module: Any) -> tuple[tuple[bool, int, tuple[tuple[int, int], ...]], ...]:
    """For each output of an ``Extract``: whether it is its whole input, its size, and the input's spans it
    concatenates; kept on the module. (Thunder's interpreter must run it as Python does: tracing it, it trips on
    e3nn's Irrep, whose len() raises.)"""
    irreps_in = module.irreps_in
    plan = []
    for irreps_out, ins in zip(module.irreps_outs, module.instructions, strict=True):
        whole = tuple(ins) == tuple(range(len(irreps_in)))
        spans = tuple((irreps_in[:i].dim, irreps_in[:i].dim + irreps_in[i].dim) for i in ins)
        plan.append((whole, irreps_out.dim, spans))
    module.__dict__["_tfg_extract_plan"] = tuple(plan)
    return module.__dict__["_tfg_extract_plan"]
