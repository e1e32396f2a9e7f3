"""The ways the zoo compiles a model (``ZooPath``, ``PATHS``), its models' names, and paths grouped for processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

Frontend = Literal["eager", "inductor", "inductor-ro", "thunder.jit", "ThunderFX"]
FRONTENDS: tuple[str, ...] = ("eager", "inductor", "inductor-ro", "thunder.jit", "ThunderFX")
_THUNDER = ("thunder.jit", "ThunderFX")
_WORDS = ("guarded", "cudagraph", "backends")  # what follows a Thunder path's frontend in its name, in this order


@dataclass(frozen=True)
class ZooPath:
    """One way the zoo compiles a model: a frontend, and on Thunder's two, with or without the FusionGuard, CUDA
    graphs (guarded: ``GuardedCUDAGraphs``; unguarded: Thunder's ``CUDAGraphTransform``) and ``choose_backends``.
    Its name (``fx-guarded+cudagraph``) is what the command line takes and the JSON is keyed by: :meth:`parse`
    reads it once, :attr:`name` writes it back the same."""

    frontend: Frontend
    guarded: bool = False
    cudagraphs: bool = False
    backends: bool = False  # guarded ThunderFX, then each subgraph by the fastest of Thunder, Inductor and eager

    def __post_init__(self) -> None:
        if self.frontend not in FRONTENDS:
            raise ValueError(f"unknown frontend {self.frontend!r}; one of {', '.join(FRONTENDS)}")
        if self.frontend not in _THUNDER and (self.guarded or self.cudagraphs or self.backends):
            raise ValueError(f"{self.frontend} has no guard, CUDA graphs or backend choice: only Thunder's paths do")
        if self.backends and (self.frontend != "ThunderFX" or not self.guarded):
            raise ValueError("the backend choice (choose_backends) is made on guarded ThunderFX only")

    @classmethod
    def parse(cls, name: str) -> ZooPath:
        """The path ``name`` names (``eager``, ``inductor-ro``, ``thunder``, ``guarded+cudagraph``, ``fx``,
        ``fx-guarded+backends``, ...); ValueError for any other text, a misordered one included."""
        if name in FRONTENDS[:3]:
            return cls(name)  # type: ignore[arg-type]
        fx = name == "fx" or name.startswith("fx-")
        tail = name[3:] if fx else "" if name == "thunder" else name
        words = tail.split("+") if tail else []
        if any(w not in _WORDS for w in words):
            raise ValueError(f"unknown zoo path {name!r}")
        path = cls("ThunderFX" if fx else "thunder.jit", *(w in words for w in _WORDS))
        if path.name != name:
            raise ValueError(f"unknown zoo path {name!r} (did you mean {path.name!r}?)")
        return path

    @property
    def name(self) -> str:
        """The path's name: the frontend (``fx`` for ThunderFX, ``thunder`` for plain ``thunder.jit``) and what is
        added to it, joined by ``+``."""
        if self.frontend not in _THUNDER:
            return self.frontend
        tail = "+".join(w for w, on in zip(_WORDS, (self.guarded, self.cudagraphs, self.backends), strict=True) if on)
        if self.frontend == "ThunderFX":
            return f"fx-{tail}" if tail else "fx"
        return tail or "thunder"

    def __str__(self) -> str:
        return self.name

    @property
    def is_thunder(self) -> bool:
        """Compiled by Thunder (``thunder.jit`` or ThunderFX)."""
        return self.frontend in _THUNDER

    @property
    def cuda_only(self) -> bool:
        """Runs only on CUDA: CUDA graphs, Thunder's or Inductor's reduce-overhead mode."""
        return self.cudagraphs or self.frontend == "inductor-ro"

    @property
    def baseline(self) -> ZooPath | None:
        """The unguarded Thunder path a guarded one is compared with, bit for bit and in time (the same frontend
        and CUDA graphs, no guard); None for unguarded paths and the backend choice (which may round otherwise)."""
        return replace(self, guarded=False) if self.guarded and not self.backends else None

    @property
    def is_baseline(self) -> bool:
        """An unguarded Thunder path: the baseline of a guarded one, and its own run-to-run difference measured."""
        return self.is_thunder and not self.guarded


PATHS = tuple(
    ZooPath.parse(name)
    for name in (
        "eager",
        "inductor",
        "inductor-ro",
        "thunder",
        "guarded",
        "cudagraph",
        "guarded+cudagraph",
        "fx",
        "fx-guarded",
        "fx-cudagraph",
        "fx-guarded+cudagraph",
        "fx-guarded+backends",
    )
)
PATH_NAMES = tuple(p.name for p in PATHS)
EAGER, INDUCTOR = ZooPath("eager"), ZooPath("inductor")
# ThunderFX with the guard, then choose_backends: each subgraph by the fastest of Thunder, Inductor and eager
# (the opt-in that may change bits, so it is compared with nothing).
BACKEND_CHOICE = ZooPath("ThunderFX", guarded=True, backends=True)
GUARDED = tuple(p for p in PATHS if p.baseline)  # the guarded paths that have an unguarded twin
# The zoo's models (zoo_models.ZOO, which imports torch), named here for --help.
MODEL_NAMES = (
    "hf-bert", "hf-t5", "hf-llama", "hf-mixtral", "timm-vit", "timm-convnext", "tv-resnet18", "nn-mha", "pyg-gat",
    "e3nn-nequip", "e3nn-nequip-rewritten", "e3nn-nequip-modules", "e3nn-nequip-modules-l3", "nequip", "mace",
    "mace-cueq", "cueq-nequip",
)  # fmt: skip


def paths_for(device: str, paths: Sequence[ZooPath] = PATHS) -> list[ZooPath]:
    """The paths that apply on ``device`` (CUDA graphs and reduce-overhead only on CUDA)."""
    return [p for p in paths if device == "cuda" or not p.cuda_only]


def path_groups(paths: Sequence[ZooPath], apart: bool = False) -> list[list[ZooPath]]:
    """``paths`` cut into groups that can run in processes of their own: each guarded path with the unguarded
    path its bits are compared with (``apart``: every Thunder path alone), every other Thunder path alone, the
    rest (eager, torch.compile) together; eager, when asked for, heads every group, so that each group's times
    have the same yardstick."""
    rest = [p for p in paths if not p.is_thunder]
    pairs = [] if apart else [g for g in GUARDED if g in paths]
    groups = [[g, *([g.baseline] if g.baseline in paths else [])] for g in pairs]
    paired = {p for g in groups for p in g}
    groups += [[p] for p in paths if p not in paired and p not in rest]
    head = [EAGER] if EAGER in paths else []
    order = {p: i for i, p in enumerate(PATHS)}
    return [rest] * bool(rest) + [head + sorted(g, key=lambda p: order.get(p, len(order))) for g in groups]
