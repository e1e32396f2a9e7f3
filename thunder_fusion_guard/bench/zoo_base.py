"""What a zoo model is (:class:`ZooModel`, ready for a training step) and how the zoo lists it (:class:`ZooEntry`),
with the losses and sizes its builders share."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class ZooModel:
    """One model of the zoo, ready for a training step: ``loss(module(*inputs))`` then ``backward()``."""

    module: nn.Module
    inputs: tuple[Any, ...]
    loss: Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model's name, the library it comes from, what it is, and its builder (``build(device)``)."""

    name: str
    library: str
    what: str
    build: Callable[[str], ZooModel]
    requires: str  # the modules that must import for it to be built, comma-separated
    small: bool = False  # cheap enough to compile and run on a 2-core CPU in the test suite

    def available(self) -> bool:
        """Whether its library is installed here."""
        return all(importlib.util.find_spec(name) is not None for name in self.requires.split(","))


def _mean_square(out: Any) -> torch.Tensor:
    """A scalar loss from any output: the model's own ``loss`` where it computed one, else the mean square of its
    first tensor, in float32."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss.float()
    if not isinstance(out, torch.Tensor):
        out = out[0] if isinstance(out, (tuple, list)) else next(v for v in out.values() if isinstance(v, torch.Tensor))
    return out.float().pow(2).mean()


def _sum(out: Any) -> torch.Tensor:
    return out.float().sum()


def _width(device: str, cpu: int, cuda: int) -> int:
    return cuda if device == "cuda" else cpu
