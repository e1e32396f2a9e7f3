"""The field's own interatomic potentials, built from their packages with random weights: NequIP (``nequip`` 0.19)
and MACE (``mace-torch`` 0.3.16). Each step is the energy of a periodic box of atoms and its gradient, the forces
(``positions.grad``) and the weights' gradients, as a training step computes them. MACE pins e3nn 0.4.4 and NequIP
needs e3nn 0.6: install each in an environment of its own (the zoo runs every model in a process of its own)."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import random
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .zoo_base import ZooModel, _sum

# Three kinds of atom, a cutoff of 4 Å and about 16 neighbours an atom (a liquid's density).
SPECIES, R_MAX, NEIGHBOURS = 3, 4.0, 16.0


def periodic_box(atoms: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """``atoms`` random atoms in a cubic periodic box sized for about :data:`NEIGHBOURS` neighbours within
    :data:`R_MAX`: positions, kinds, the neighbour list (minimum image) and each edge's cell shift."""
    g = torch.Generator().manual_seed(seed)
    side = (atoms / (NEIGHBOURS / (4 / 3 * math.pi * R_MAX**3))) ** (1 / 3)
    positions = torch.rand(atoms, 3, generator=g) * side
    delta = positions[None, :, :] - positions[:, None, :]
    shift = -torch.round(delta / side)
    distance = (delta + shift * side).norm(dim=-1)
    i, j = torch.nonzero((distance < R_MAX) & (distance > 0), as_tuple=True)
    return {
        "positions": positions.to(device),
        "kinds": torch.randint(0, SPECIES, (atoms,), generator=g).to(device),
        "edge_index": torch.stack([i, j]).to(device),
        "cell": (torch.eye(3) * side).to(device),
        "shifts": shift[i, j].to(device),  # in cells
    }


def _forked_rng() -> contextlib.AbstractContextManager:
    """Every generator of the process, CPU's and each CUDA device's, put back as it was on leaving: a zoo model
    draws its weights from a seed of its own without changing the process's random streams."""
    return torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else [])


@contextlib.contextmanager
def _nequip_global_state() -> Iterator[None]:
    """nequip builds a model only after ``set_global_state()``, which sets process-wide state: seeds for every
    generator, float64 as the default dtype, Dynamo's ``capture_scalar_outputs``, TF32 off, TorchScript's fusion
    strategy, environment variables, e3nn's defaults. The model is built inside it and all of it is put back
    after, so that building a zoo model changes nothing else in the process."""
    import e3nn
    import numpy as np
    from nequip.utils import global_state

    dtype, environ = torch.get_default_dtype(), dict(os.environ)
    dynamo, e3nn_defaults = torch._dynamo.config.get_config_copy(), e3nn.get_optimization_defaults()
    sharing, python_rng, numpy_rng = (
        torch.multiprocessing.get_sharing_strategy(),
        random.getstate(),
        np.random.get_state(),
    )
    fusion = torch.jit.set_fusion_strategy([("STATIC", 2)])
    torch.jit.set_fusion_strategy(fusion)
    precision = torch.backends.fp32_precision if torch.cuda.is_available() else None
    nequip_state = (global_state._GLOBAL_STATE_INITIALIZED, dict(global_state._latest_global_config))
    try:
        with _forked_rng():
            global_state.set_global_state()
            torch.set_default_dtype(dtype)  # the model's own dtype is an argument; its helpers read the default
            yield
    finally:
        torch.set_default_dtype(dtype)
        torch._dynamo.config.load_config(dynamo)
        e3nn.set_optimization_defaults(**e3nn_defaults)
        torch.multiprocessing.set_sharing_strategy(sharing)
        random.setstate(python_rng)
        np.random.set_state(numpy_rng)
        torch.jit.set_fusion_strategy(fusion)
        if precision is not None and torch.backends.fp32_precision != precision:
            torch.backends.fp32_precision = precision
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
        global_state._GLOBAL_STATE_INITIALIZED = nequip_state[0]
        global_state._latest_global_config.clear()
        global_state._latest_global_config.update(nequip_state[1])


class NequIPEnergy(nn.Module):
    """NequIP's energy model (``NequIPGNNModel`` without its force output): positions in, total energy out."""

    def __init__(self, layers: int, l_max: int, features: int) -> None:
        from nequip.model import NequIPGNNModel

        super().__init__()
        kinds = ["H", "C", "O"][:SPECIES]
        with _nequip_global_state():
            model = NequIPGNNModel(
                seed=0,
                model_dtype="float32",
                type_names=kinds,
                r_max=R_MAX,
                num_layers=layers,
                l_max=l_max,
                num_features=features,
                radial_mlp_depth=1,
                radial_mlp_width=features,
                avg_num_neighbors=NEIGHBOURS,
                per_type_energy_shifts=dict.fromkeys(kinds, 0.0),
            )
        self.energy = model.model.func  # the force output's energy model: forces come from backward here

    def forward(self, positions, kinds, edge_index, cell, shifts) -> torch.Tensor:
        data = {
            "pos": positions,
            "atom_types": kinds,
            "edge_index": edge_index,
            "cell": cell,
            "edge_cell_shift": shifts,
        }
        return self.energy(data)["total_energy"].sum()


class MACEEnergy(nn.Module):
    """MACE (``mace.modules.MACE``, the configuration its papers train) called without its own force output."""

    def __init__(
        self, interactions: int, channels: int, max_ell: int, correlation: int, cueq_device: str | None = None
    ) -> None:
        import numpy as np

        # e3nn 0.4.4 loads its constants with torch.load, whose default (weights_only) refuses the slices in them.
        with torch.serialization.safe_globals([slice]):
            from e3nn import o3
            from mace import modules

        super().__init__()
        # Built as MACE builds a model for torch.compile (mace.tools.compile.prepare, less its process-wide Dynamo
        # settings): without e3nn's TorchScript code generation, which Dynamo cannot trace and Thunder's interpreter
        # aborts on, and its readouts' activations traced by torch.fx (Dynamo's guards trip on e3nn 0.4.4's Irrep).
        from mace.tools.compile import disable_e3nn_codegen, simplify

        # Weights drawn from a fixed seed, as nequip's are (seed=0): every process builds the same model, and the
        # process's own generators are left as they were.
        with disable_e3nn_codegen(), _forked_rng():
            torch.manual_seed(0)
            self.model = modules.MACE(
                r_max=R_MAX,
                num_bessel=8,
                num_polynomial_cutoff=5,
                max_ell=max_ell,
                interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
                interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
                num_interactions=interactions,
                num_elements=SPECIES,
                hidden_irreps=o3.Irreps(f"{channels}x0e + {channels}x1o"),
                MLP_irreps=o3.Irreps("16x0e"),
                atomic_energies=np.zeros(SPECIES),
                avg_num_neighbors=NEIGHBOURS,
                atomic_numbers=[1, 6, 8][:SPECIES],
                correlation=correlation,
                gate=torch.nn.functional.silu,
                **({} if cueq_device is None else {"cueq_config": _cueq_config(cueq_device)}),
            )
        simplify(self.model)

    def forward(self, positions, kinds, edge_index, cell, shifts) -> torch.Tensor:
        atoms = positions.shape[0]
        data = {
            "positions": positions,
            "node_attrs": torch.nn.functional.one_hot(kinds, SPECIES).to(positions.dtype),
            "edge_index": edge_index,
            "shifts": shifts @ cell,
            "unit_shifts": shifts,
            "cell": cell,
            "batch": torch.zeros(atoms, dtype=torch.long, device=positions.device),
            "ptr": torch.tensor([0, atoms], device=positions.device),
        }
        return self.model(data, training=True, compute_force=False)["energy"].sum()


def _cueq_config(device: str) -> Any:
    """cuEquivariance for every MACE block, as MACE's ``convert_e3nn_cueq`` sets it (its conv fusion on CUDA)."""
    from mace.modules.wrapper_ops import CuEquivarianceConfig

    return CuEquivarianceConfig(
        enabled=True, layout="ir_mul", group="O3_e3nn", optimize_all=True, conv_fusion=device == "cuda"
    )


def _box_inputs(device: str, atoms: int) -> tuple[torch.Tensor, ...]:
    box = periodic_box(atoms, device)
    positions = box["positions"].requires_grad_()
    return positions, box["kinds"], box["edge_index"], box["cell"], box["shifts"]


# What to install for each builder's package, said in one line when it is missing.
INSTALL = {
    "nequip": 'pip install ".[nequip]" in a clone of thunder-fusion-guard (nequip 0.19.1, e3nn 0.6)',
    "mace": "pip install mace-torch==0.3.16, in an environment of its own (it pins e3nn 0.4.4; NequIP needs 0.6)",
    "cuequivariance_torch": "pip install cuequivariance-torch==0.13.0 (and its CUDA ops for the GPU)",
}


def _require(package: str) -> None:
    """ModuleNotFoundError in one line naming what to install (:data:`INSTALL`) where ``package`` is not installed;
    nothing is imported here (an installed package's own import errors stay its own)."""
    if importlib.util.find_spec(package) is None:
        raise ModuleNotFoundError(f"{package} is not installed: {INSTALL[package]}", name=package)


def nequip_potential(device: str, layers: int = 3, l_max: int = 2, features: int = 32, atoms: int = 100) -> ZooModel:
    """NequIP from its package: 3 layers, l_max 2, 32 features, 100 atoms (about 1600 edges)."""
    _require("nequip")
    model = NequIPEnergy(layers, l_max, features).to(device)
    return ZooModel(model, _box_inputs(device, atoms), _sum)


def mace_potential(
    device: str,
    interactions: int = 2,
    channels: int = 32,
    max_ell: int = 2,
    correlation: int = 3,
    atoms: int = 100,
    cueq: bool = False,
) -> ZooModel:
    """MACE from its package: 2 interactions, ``32x0e + 32x1o``, max_ell 2, correlation 3, 100 atoms; ``cueq``:
    its blocks by cuEquivariance's kernels (``cuequivariance-torch``, fused on CUDA), as MACE's ``enable_cueq``."""
    _require("mace")
    if cueq:  # without it, MACE would build its e3nn blocks after a warning
        _require("cuequivariance_torch")
    model = MACEEnergy(interactions, channels, max_ell, correlation, device if cueq else None).to(device)
    return ZooModel(model, _box_inputs(device, atoms), _sum)
