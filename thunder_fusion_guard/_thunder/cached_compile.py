"""Inductor's compile of a torch.fx graph outside Dynamo, kept by Inductor's caches as Dynamo's compiles are.

Inductor's FX-graph and AOT-autograd caches key a compile by its graph and its inputs' shapes, and read the guards of a
cached entry from the shape environment of the tracing context it runs in; outside one (``torch._inductor.compile``
called on its own) both caches are bypassed ("No shape env"), so every process compiled the guard's whole graphs, its
Inductor rescues and its timed backends again: minutes a graph on NequIP. Here the compile runs in a tracing context
whose fake tensors stand for the inputs with their shapes and strides fixed, as Dynamo hands a static graph over: the
same program, now written to and read from the caches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

__all__ = ["inductor_compile"]


def inductor_compile(module: torch.fx.GraphModule, inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """``torch._inductor.compile(module, inputs, options)``, cacheable: static in the shapes and strides of
    ``inputs``. Where an input is not a plain tensor (a number Inductor would make a symbol, a tensor subclass) or
    has no fake tensor, the plain compile, as before."""
    plain = all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in inputs)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    try:
        fakes = [mode.from_tensor(x, static_shapes=True) for x in inputs] if plain else None
    except Exception:  # a tensor fake tensors cannot stand for: the compile as torch's own call makes it
        fakes = None
    if fakes is None:
        return torch._inductor.compile(module, list(inputs), options)
    with torch._guards.tracing(torch._guards.TracingContext(mode)):
        return torch._inductor.compile(module, fakes, options)
