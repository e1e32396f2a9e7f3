"""The zoo's equivariant interatomic potentials: the NequIP-style potential with hand-written tensor products,
and the NequIP potential assembled from e3nn's own modules as NequIP's users assemble it (in two configurations,
and once more with cuequivariance-torch's layers in place of e3nn's: the hand-fused anchor)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .zoo_base import ZooModel, _sum, _width


class NequIPLike(nn.Module):
    """A NequIP-style interatomic potential: spherical harmonics of the edge vectors (e3nn), Bessel radial basis
    with NequIP's polynomial cutoff, a radial MLP giving each edge's tensor-product weights, a "uvu" tensor
    product per path (outer product, then a matmul with e3nn's Clebsch-Gordan coefficients), scatter-sum
    (``index_add``) to the atoms, linear self-interaction, gated nonlinearity, residuals; three layers of 16
    channels for l = 0, 1, 2; summed energy.

    The tensor product is written here in plain PyTorch; :class:`E3nnNequIP` is the same kind of model from e3nn's
    own modules. ``rewritten``: the same model
    with the changes why-not-fused suggests for the ops ThunderFX keeps out of Thunder (``scatter_add`` for
    ``index_add``, ``pow(2).sum().sqrt()`` for ``norm``, ``torch.zeros`` for ``new_zeros``).
    """

    def __init__(self, rewritten: bool = False, channels: int = 16, layers: int = 3, lmax: int = 2) -> None:
        from e3nn import o3

        super().__init__()
        species, r_max, basis = 4, 4.0, 8  # kinds of atom, cutoff radius, radial basis functions
        self.rewritten = rewritten
        self.r_max, self.lmax, self.channels, self.layers = r_max, lmax, channels, layers
        self.sh = o3.SphericalHarmonics(list(range(lmax + 1)), normalize=True, normalization="component")
        self.embed = nn.Embedding(species, channels)
        self.register_buffer("frequencies", torch.arange(1, basis + 1) * math.pi / r_max)
        degrees = range(lmax + 1)
        self.paths = [
            (l1, l2, l3)
            for l1 in degrees
            for l2 in degrees
            for l3 in degrees
            if abs(l1 - l2) <= l3 <= l1 + l2 and (l1 + l2 + l3) % 2 == 0
        ]
        for i, (l1, l2, l3) in enumerate(self.paths):
            self.register_buffer(f"cg{i}", o3.wigner_3j(l1, l2, l3) * math.sqrt(2 * l3 + 1))
        self.radials = nn.ModuleList(
            nn.Sequential(nn.Linear(basis, 32), nn.SiLU(), nn.Linear(32, len(self.paths) * channels))
            for _ in range(layers)
        )
        # Per layer and degree: channels in -> channels out; for l = 0 also the gates of l = 1..lmax.
        self.linears = nn.ModuleList(
            nn.ParameterList(
                nn.Parameter(torch.randn(channels, channels * (lmax + 1 if degree == 0 else 1)) / math.sqrt(channels))
                for degree in degrees
            )
            for _ in range(layers)
        )
        self.readout = nn.Linear(channels, 1)

    def bessel(self, length: torch.Tensor) -> torch.Tensor:
        """NequIP's radial basis: Bessel functions times its polynomial cutoff (p = 6)."""
        r = length[:, None]
        u = r / self.r_max
        cutoff = (1 - 28 * u**6 + 48 * u**7 - 21 * u**8) * (u < 1)
        return math.sqrt(2 / self.r_max) * torch.sin(self.frequencies * r) / r * cutoff

    def scatter_sum(self, messages: torch.Tensor, dst: torch.Tensor, atoms: int) -> torch.Tensor:
        """Each edge's message summed into its destination atom."""
        out = torch.zeros(atoms, *messages.shape[1:], dtype=messages.dtype, device=messages.device)
        if self.rewritten:
            return out.scatter_add(0, dst[:, None, None].expand_as(messages), messages)
        return out.index_add(0, dst, messages)

    def forward(self, pos: torch.Tensor, species: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        vec = pos[dst] - pos[src]
        sh = self.sh(vec)
        sh_l = [sh[:, d * d : (d + 1) * (d + 1)] for d in range(self.lmax + 1)]
        basis = self.bessel(vec.pow(2).sum(1).sqrt() if self.rewritten else vec.norm(dim=1))
        atoms, c = pos.shape[0], self.channels
        x = [self.embed(species)[:, :, None]] + [
            torch.zeros(atoms, c, 2 * d + 1, dtype=pos.dtype, device=pos.device)
            if self.rewritten
            else pos.new_zeros(atoms, c, 2 * d + 1)
            for d in range(1, self.lmax + 1)
        ]
        norm = math.sqrt(src.shape[0] / atoms)
        for layer in range(self.layers):
            weights = self.radials[layer](basis).view(-1, len(self.paths), c)
            messages = [None] * (self.lmax + 1)
            for i, (l1, l2, l3) in enumerate(self.paths):
                cg = getattr(self, f"cg{i}")
                outer = (x[l1][src][:, :, :, None] * sh_l[l2][:, None, None, :]).flatten(2)
                term = (outer @ cg.flatten(0, 1)) * weights[:, i, :, None]
                messages[l3] = term if messages[l3] is None else messages[l3] + term
            summed = [self.scatter_sum(m, dst, atoms) / norm for m in messages]
            mixed = [w.T @ s for s, w in zip(summed, self.linears[layer], strict=True)]
            scalars, gates = mixed[0][:, :c], torch.sigmoid(mixed[0][:, c:, 0])
            new = [torch.nn.functional.silu(scalars)]
            new += [mixed[d] * gates[:, (d - 1) * c : d * c, None] for d in range(1, self.lmax + 1)]
            x = [a + b for a, b in zip(x, new, strict=True)]
        return self.readout(x[0][:, :, 0]).sum()


def nequip(device: str, rewritten: bool = False) -> ZooModel:
    """The NequIP-style potential on a random cluster of atoms; the step is the energy and its gradient with
    respect to the positions (the forces) and the weights."""
    inputs = _atoms(device)
    model = NequIPLike(rewritten=rewritten).to(device).eval()
    return ZooModel(model, inputs, _sum)


@dataclass(frozen=True)
class EquivariantOps:
    """Where the equivariant layers of :class:`E3nnNequIP` come from: builders of a fully connected tensor product
    with per-edge weights ``(irreps_in, irreps_sh, irreps_out)``, a linear layer ``(irreps_in, irreps_out)`` and the
    spherical harmonics ``(lmax)``, each taking and giving e3nn's layout (channels, then the irrep's components)."""

    tensor_product: Callable[[Any, Any, Any], nn.Module]
    linear: Callable[[Any, Any], nn.Module]
    spherical_harmonics: Callable[[int], nn.Module]


def e3nn_ops() -> EquivariantOps:
    """e3nn's own modules (e3nn generates their code with torch.fx)."""
    from e3nn import o3

    return EquivariantOps(
        lambda i1, i2, out: o3.FullyConnectedTensorProduct(i1, i2, out, shared_weights=False, internal_weights=False),
        o3.Linear,
        lambda lmax: o3.SphericalHarmonics(
            o3.Irreps.spherical_harmonics(lmax), normalize=True, normalization="component"
        ),
    )


def cueq_ops(device: str) -> EquivariantOps:
    """NVIDIA's cuequivariance-torch modules in e3nn's layout: its fused CUDA kernels on CUDA ("fused_tp"), its
    plain PyTorch method elsewhere ("naive")."""
    import cuequivariance as cue
    import cuequivariance_torch as cuet

    method = "fused_tp" if device == "cuda" else "naive"
    sh_method = "uniform_1d" if device == "cuda" else "naive"

    def irreps(x: Any) -> Any:
        return cue.Irreps("O3", str(x))

    return EquivariantOps(
        lambda i1, i2, out: cuet.FullyConnectedTensorProduct(
            irreps(i1),
            irreps(i2),
            irreps(out),
            layout=cue.mul_ir,
            shared_weights=False,
            internal_weights=False,
            method=method,
        ),
        lambda i, out: cuet.Linear(irreps(i), irreps(out), layout=cue.mul_ir, method=method),
        lambda lmax: cuet.SphericalHarmonics(list(range(lmax + 1)), normalize=True, method=sh_method),
    )


class E3nnInteraction(nn.Module):
    """One NequIP interaction block from e3nn's modules: a fully connected tensor product of the atoms' features
    (gathered on each edge) with the edge's spherical harmonics, its per-edge weights given by a radial MLP,
    summed into the destination atoms with ``index_add``, then an equivariant linear layer."""

    def __init__(self, irreps_in: Any, irreps_sh: Any, irreps_out: Any, basis: int, ops: EquivariantOps) -> None:
        super().__init__()
        self.tp = ops.tensor_product(irreps_in, irreps_sh, irreps_out)
        self.radial = nn.Sequential(nn.Linear(basis, 32), nn.SiLU(), nn.Linear(32, self.tp.weight_numel))
        self.linear = ops.linear(irreps_out, irreps_out)

    def forward(
        self, x: torch.Tensor, sh: torch.Tensor, basis: torch.Tensor, src: torch.Tensor, dst: torch.Tensor
    ) -> torch.Tensor:
        messages = self.tp(x[src], sh, self.radial(basis))
        zeros = torch.zeros(x.shape[0], messages.shape[1], dtype=messages.dtype, device=messages.device)
        return self.linear(zeros.index_add(0, dst, messages))


class E3nnNequIP(nn.Module):
    """A NequIP potential as its users build it, from e3nn's own modules (written here, from NequIP's recipe):
    ``o3.SphericalHarmonics`` of the edge vectors, a Bessel basis with NequIP's polynomial cutoff, interaction
    blocks of ``o3.FullyConnectedTensorProduct`` (e3nn's instructions and path weights) and ``o3.Linear``, the
    ``nn.Gate`` nonlinearity (SiLU on scalars, sigmoid gates on l = 1 to ``lmax``), and a linear readout summed to the
    energy. e3nn generates the tensor products' code with torch.fx. ``ops``: where the tensor products, linear
    layers and spherical harmonics come from (default e3nn's; :func:`cueq_ops`: cuequivariance's)."""

    def __init__(
        self,
        channels: int = 8,
        lmax: int = 2,
        layers: int = 2,
        r_max: float = 4.0,
        basis: int = 8,
        ops: EquivariantOps | None = None,
    ) -> None:
        from e3nn import o3
        from e3nn.nn import Gate

        super().__init__()
        ops = ops or e3nn_ops()
        self.r_max = r_max
        irreps_sh = o3.Irreps.spherical_harmonics(lmax)
        self.sh = ops.spherical_harmonics(lmax)
        self.embed = nn.Embedding(4, channels)
        self.register_buffer("frequencies", torch.arange(1, basis + 1) * math.pi / r_max)
        irreps = o3.Irreps(f"{channels}x0e")
        gated = o3.Irreps(" + ".join(f"{channels}x{d}{'e' if d % 2 == 0 else 'o'}" for d in range(1, lmax + 1)))
        self.interactions, self.gates = nn.ModuleList(), nn.ModuleList()
        for _ in range(layers):
            gate = Gate(f"{channels}x0e", [nn.functional.silu], f"{gated.num_irreps}x0e", [torch.sigmoid], gated)
            self.interactions.append(E3nnInteraction(irreps, irreps_sh, gate.irreps_in, basis, ops))
            self.gates.append(gate)
            irreps = gate.irreps_out
        self.readout = ops.linear(irreps, o3.Irreps("1x0e"))

    def forward(self, pos: torch.Tensor, species: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        vec = pos[dst] - pos[src]
        sh = self.sh(vec)
        r = vec.norm(dim=1)[:, None]
        u = r / self.r_max
        cutoff = (1 - 28 * u**6 + 48 * u**7 - 21 * u**8) * (u < 1)
        basis = math.sqrt(2 / self.r_max) * torch.sin(self.frequencies * r) / r * cutoff
        x = self.embed(species)
        for interaction, gate in zip(self.interactions, self.gates, strict=True):
            x = gate(interaction(x, sh, basis, src, dst))
        return self.readout(x).sum()


def _atoms(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random cluster of atoms: positions (requiring grad: the forces), species, and the edges within 4 Å."""
    atoms = _width(device, 24, 256)
    generator = torch.Generator().manual_seed(0)
    pos = (torch.rand(atoms, 3, generator=generator) * atoms ** (1 / 3) * 1.6).to(device)
    species = torch.randint(0, 4, (atoms,), generator=generator).to(device)
    near = torch.cdist(pos, pos) < 4.0
    near.fill_diagonal_(False)  # no atom is its own neighbour (cdist's matmul path gives it a distance near, not at, 0)
    src, dst = near.nonzero().T
    return pos.requires_grad_(True), species, src.contiguous(), dst.contiguous()


def e3nn_nequip(device: str, lmax: int = 2, layers: int = 2, channels: int = 8, cuda_channels: int = 32) -> ZooModel:
    """The e3nn-built NequIP potential (spherical harmonics to ``lmax``, ``layers`` interaction blocks, ``channels``
    on CPU, ``cuda_channels`` on CUDA); the step is the energy and its gradient with respect to the positions and
    the weights. Each edge's tensor-product weights grow with the channels squared and the paths (l = 3 has about
    three times the paths of l = 2), so the l = 3 model keeps the l = 2 model's width on CUDA."""
    torch.manual_seed(0)
    width = _width(device, channels, cuda_channels)
    model = E3nnNequIP(channels=width, lmax=lmax, layers=layers).to(device).eval()
    return ZooModel(model, _atoms(device), _sum)


def e3nn_nequip_small(device: str, atoms: int = 64, neighbours: int = 8) -> ZooModel:
    """A small, host-bound e3nn-built NequIP step: 3 interaction blocks, l = 2, 8 channels, ``atoms`` atoms each
    with its ``neighbours`` nearest as edges (64 and 8: 512 edges); energy and its gradients."""
    torch.manual_seed(0)
    model = E3nnNequIP(channels=8, lmax=2, layers=3).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    pos = torch.rand(atoms, 3, generator=generator) * atoms ** (1 / 3) * 1.6
    species = torch.randint(0, 4, (atoms,), generator=generator)
    distance = torch.cdist(pos, pos).fill_diagonal_(float("inf"))
    dst = distance.topk(neighbours, largest=False).indices.reshape(-1)
    src = torch.arange(atoms).repeat_interleave(neighbours)
    inputs = (pos.to(device).requires_grad_(True), species.to(device), src.to(device), dst.to(device))
    return ZooModel(model, inputs, _sum)


def cueq_nequip(device: str) -> ZooModel:
    """The e3nn-built NequIP potential (l = 2, two blocks) with NVIDIA's cuequivariance-torch tensor products,
    linear layers and spherical harmonics in place of e3nn's: on CUDA its hand-written fused kernels, the anchor
    that the compiled paths of ``e3nn-nequip-modules`` are read against (same sizes, same atoms)."""
    torch.manual_seed(0)
    model = E3nnNequIP(channels=_width(device, 8, 32), ops=cueq_ops(device)).to(device).eval()
    return ZooModel(model, _atoms(device), _sum)
