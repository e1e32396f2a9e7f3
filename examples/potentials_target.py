"""TARGETs for ``fusion-guard kernels`` (and ``report``): the zoo's small e3nn-built NequIP and, where their packages
are installed, NequIP and MACE, each after ``translate_library_ops()`` (the configuration README gives for e3nn
models); MACE with cuEquivariance's kernels as the zoo runs it, untranslated.

    fusion-guard kernels examples/potentials_target.py:e3nn_small --thunderfx --against inductor
    fusion-guard kernels examples/potentials_target.py:mace --thunderfx --against inductor --json mace.json
"""

from __future__ import annotations

from typing import Any

from thunder_fusion_guard import translate_library_ops
from thunder_fusion_guard.bench.zoo_models import ZOO


def _zoo(name: str, device: str, translate: bool = True) -> tuple[Any, tuple]:
    if translate:
        translate_library_ops()
    built = ZOO[name].build(device)
    return built.module, built.inputs


def e3nn_small(device: str = "cuda") -> tuple[Any, tuple]:
    """3 interaction blocks of e3nn's modules, l = 2, 8 channels, 64 atoms, 512 edges."""
    from thunder_fusion_guard.bench.zoo_equivariant import e3nn_nequip_small

    translate_library_ops()
    built = e3nn_nequip_small(device)
    return built.module, built.inputs


def nequip(device: str = "cuda") -> tuple[Any, tuple]:
    """nequip 0.19's NequIPGNNModel: 3 layers, l_max 2, 32 features, 100 atoms."""
    return _zoo("nequip", device)


def mace(device: str = "cuda") -> tuple[Any, tuple]:
    """mace-torch 0.3.16's MACE: 2 interactions, 32x0e+32x1o, max_ell 2, correlation 3, 100 atoms."""
    return _zoo("mace", device)


def mace_cueq(device: str = "cuda") -> tuple[Any, tuple]:
    """The same MACE with cuEquivariance's kernels (MACE's enable_cueq)."""
    return _zoo("mace-cueq", device, translate=False)
