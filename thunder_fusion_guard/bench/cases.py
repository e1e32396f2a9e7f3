"""Benchmark cases, shared by ``fusion-guard bench run`` and the pytest-benchmark suites in benchmarks/.

A case builds a workload on a device; each variant runs it eagerly (``eager``), through Thunder
(``thunder``), through Thunder with a :class:`FusionGuard` (``guarded``), or through ``torch.compile``
(``inductor``, and ``inductor-ro`` with ``mode="reduce-overhead"``, Inductor's CUDA-graph mode: on CPU
there are no CUDA graphs and it compiles as ``inductor`` does). On CPU Thunder uses its torch.compile
executor (nvFuser needs CUDA); on CUDA its defaults (nvFuser). Micro cases measure what Thunder's defaults
produce; on CUDA the ``-shapeonly`` micro cases (CUDA only) also ask Thunder for shape-only nvFuser regions
(``nv_enable_shape_only_fusion=True``) and let the guard undo them (``rewrites={"override_compile_options": True}``), so
that lone view ops reach the fusion executor at all: a setting no default user has, labelled as such. The
ThunderFX suite does the same on CUDA. Heavy cases (litgpt models) run only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

VARIANTS = ("thunder", "guarded", "eager")  # the default set
INDUCTOR_MODES: dict[str, str | None] = {"inductor": None, "inductor-ro": "reduce-overhead"}
ALL_VARIANTS = (*VARIANTS, *INDUCTOR_MODES)
VARIANT_BUILDS = {
    "thunder": "thunder.jit(fn)",
    "guarded": "thunder.jit(fn, transforms=[FusionGuard()])",
    "eager": "fn",
    "inductor": "torch.compile(fn)",
    "inductor-ro": 'torch.compile(fn, mode="reduce-overhead")',
}
SUITES = ("micro", "models", "thunderfx")


def variant_build(variant: str, frontend: str = "jit") -> str:
    """How ``variant`` compiles the function (:data:`VARIANT_BUILDS`), through ThunderFX where ``frontend`` says so."""
    build = VARIANT_BUILDS[variant]
    return build.replace("thunder.jit(", "thunderfx(") if frontend == "thunderfx" else build


HEAVY_ENV = "TFG_BENCH_HEAVY"
VARIANTS_ENV = "TFG_BENCH_VARIANTS"


def parse_variants(text: str, allowed: tuple[str, ...] = ALL_VARIANTS) -> tuple[str, ...]:
    """Variant names from ``"thunder,inductor"`` (commas or spaces; ``all`` for every one of ``allowed``), in
    the order given.

    ``ValueError`` naming the first unknown variant and the allowed ones.
    """
    names = [n for n in text.replace(",", " ").split() if n]
    if not names:
        raise ValueError(f"no variant given; allowed: {', '.join(allowed)} (or all)")
    if names == ["all"]:
        return allowed
    for name in names:
        if name not in allowed:
            raise ValueError(f"unknown variant {name!r}; allowed: {', '.join(allowed)} (or all)")
    return tuple(dict.fromkeys(names))


def requested_variants() -> tuple[str, ...]:
    """The variants the pytest-benchmark suites run: ``TFG_BENCH_VARIANTS`` if set, else the default set."""
    text = os.environ.get(VARIANTS_ENV, "")
    return parse_variants(text) if text.strip() else VARIANTS


@dataclass
class Workload:
    """A callable, its inputs, and how one step runs it."""

    fn: Callable[..., Any]
    args: tuple
    backward: bool = False
    jit_options: dict[str, Any] = field(default_factory=dict)
    frontend: str = "jit"
    leaves: list[torch.Tensor] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    no_grad: bool = False
    guard_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchCase:
    """One benchmark: ``build(device)`` makes its workload; results are grouped by ``group``."""

    suite: str
    name: str
    build: Callable[[str], Workload]
    heavy: bool = False
    cuda_only: bool = False

    @property
    def group(self) -> str:
        return f"{self.suite}:{self.name}"

    def bench_name(self, variant: str) -> str:
        """The pytest-benchmark name of one variant, the same from the CLI and from pytest."""
        return f"test_{self.suite}[{self.name}-{variant}]"

    def fullname(self, variant: str) -> str:
        return f"benchmarks/test_{self.suite}.py::{self.bench_name(variant)}"


def heavy_requested() -> bool:
    return os.environ.get(HEAVY_ENV, "") not in ("", "0")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --- micro: one op alone in a program, per op kind, small and large ---------------------------------

SIZES = {
    "cpu": {"small": (16, 32, 32), "large": (32, 256, 256)},
    "cuda": {"small": (16, 32, 32), "large": (64, 1024, 1024)},
}


def _view(x):
    return x.view(x.shape[0], -1)


def _reshape(x):
    return x.reshape(-1, x.shape[-1])


def _permute(x):
    return x.permute(0, 2, 1)


def _expand(x):
    return x.expand(4, -1, -1)


def _slice(x):
    return x[:, 1:, :-1]


def _squeeze(x):
    return x.squeeze(1)


def _unsqueeze(x):
    return x.unsqueeze(1)


def _copy(dst, src):
    return dst.copy_(src)


def _add(x, y):
    return x + y


def _cast(x):
    return x.to(torch.bfloat16)


def _mask_loop(x):
    """litgpt's sliding-window mask loop (Mistral): one setitem per row, then one add."""
    t = x.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device)
    for i in range(t):
        mask[i, max(0, i - 3) : i + 1] = 0.0
    return x + mask


def _identity_chain(x):
    return x.reshape(x.shape).permute(*range(x.ndim)).to(x.dtype).view(x.shape) * 2.0


# op kind -> (program, input shapes as functions of the size)
MICRO_OPS: dict[str, tuple[Callable[..., Any], Callable[[tuple[int, ...]], list[tuple[int, ...]]]]] = {
    "view": (_view, lambda s: [s]),
    "reshape": (_reshape, lambda s: [s]),
    "permute": (_permute, lambda s: [s]),
    "expand": (_expand, lambda s: [(1, s[0] * s[1] // 4, s[2])]),
    "slice": (_slice, lambda s: [s]),
    "squeeze": (_squeeze, lambda s: [(s[0], 1, s[1], s[2])]),
    "unsqueeze": (_unsqueeze, lambda s: [s]),
    "copy_": (_copy, lambda s: [s, s]),
    "add": (_add, lambda s: [s, s]),
    "cast": (_cast, lambda s: [s]),
    "setitem-loop": (_mask_loop, lambda s: [(min(s[1], 128), min(s[1], 128))]),
    "identity-chain": (_identity_chain, lambda s: [s]),
}


# The nvFuser opt-in that makes lone views into regions, and the guard option that undoes them anyway.
SHAPE_ONLY = {"nv_enable_shape_only_fusion": True}
OVERRIDE = {"rewrites": {"override_compile_options": True}}
VIEW_OPS = ("view", "reshape", "permute", "expand", "slice", "squeeze", "unsqueeze")


def _micro(op: str, size: str, shape_only: bool = False) -> Callable[[str], Workload]:
    fn, shapes = MICRO_OPS[op]

    def build(device: str) -> Workload:
        dims = SIZES["cuda" if device == "cuda" else "cpu"][size]
        args = tuple(torch.randn(shape, device=device) for shape in shapes(dims))
        if shape_only and device == "cuda":
            return Workload(fn, args, jit_options=dict(SHAPE_ONLY), guard_options=dict(OVERRIDE))
        return Workload(fn, args)

    return build


# --- models: a nanoGPT block, litgpt models at 2 layers ---------------------------------------------


def nanogpt_block(device: str, requires_grad: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """A nanoGPT transformer block and its input: GPT-2 width, 4 x 512 tokens, bf16 on CUDA; small, fp32 on CPU."""
    from thunder.tests.nanogpt_model import Block, GPTConfig

    cuda = device == "cuda"
    config = GPTConfig(n_embd=768 if cuda else 64, n_head=12 if cuda else 4, block_size=512, dropout=0.0)
    batch, tokens = (4, 512) if cuda else (2, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    block = Block(config).to(device=device, dtype=dtype)
    x = torch.randn(batch, tokens, config.n_embd, device=device, dtype=dtype, requires_grad=requires_grad)
    return block, x


def _nanogpt_block(backward: bool) -> Callable[[str], Workload]:
    def build(device: str) -> Workload:
        block, x = nanogpt_block(device, requires_grad=backward)
        leaves = [*block.parameters(), x] if backward else []
        if not backward:
            block.requires_grad_(False)
        return Workload(block, (x,), backward=backward, leaves=leaves)

    return build


LITGPT_MODELS = {"mistral": "Mistral-7B-v0.1", "llama2": "Llama-2-7b-hf", "phi2": "phi-2"}


def litgpt_model(name: str, device: str, tokens: int) -> Any:
    """litgpt's ``GPT`` for config ``name`` at 2 layers: real widths in bf16 on CUDA, tiny widths in fp32 on CPU."""
    import litgpt
    from litgpt.model import GPT

    if device == "cuda":
        config = litgpt.Config.from_name(name, n_layer=2)
    else:
        full = litgpt.Config.from_name(name)
        config = litgpt.Config.from_name(
            name,
            n_layer=2,
            n_embd=64,
            n_head=4,
            n_query_groups=min(4, full.n_query_groups),
            head_size=16,
            intermediate_size=128,
            vocab_size=256,
            padded_vocab_size=256,
            block_size=64,
        )
    with torch.device(device):
        model = GPT(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.max_seq_length = tokens
    return model


def _litgpt(name: str) -> Callable[[str], Workload]:
    def build(device: str) -> Workload:
        tokens = 512 if device == "cuda" else 32
        model = litgpt_model(name, device, tokens)
        x = torch.randint(0, model.config.padded_vocab_size, (1, tokens), device=device)
        return Workload(model, (x,), backward=True, leaves=list(model.parameters()))

    return build


def prefilled_kv_cache(model: Any, max_seq_length: int) -> None:
    """Give ``model`` a batch-1 KV cache of ``max_seq_length`` filled with random keys and values, as after a prompt."""
    param = next(model.parameters())
    model.set_kv_cache(batch_size=1, max_seq_length=max_seq_length, device=param.device, dtype=param.dtype)
    generator = torch.Generator(device=param.device).manual_seed(0)
    for block in model.transformer.h:
        for buffer in (block.attn.kv_cache.k, block.attn.kv_cache.v):
            buffer.copy_(torch.randn(buffer.shape, generator=generator, device=buffer.device, dtype=buffer.dtype))


def _litgpt_decode(name: str) -> Callable[[str], Workload]:
    """One decode step: a batch-1 KV cache half full, one token at the middle position, under ``torch.no_grad()``.

    Every call writes the same cache slot with the same keys and values, so calls and variants stay alike.
    """

    def build(device: str) -> Workload:
        tokens = 512 if device == "cuda" else 32
        model = litgpt_model(name, device, tokens).requires_grad_(False)
        prefilled_kv_cache(model, tokens)
        x = torch.randint(0, model.config.padded_vocab_size, (1, 1), device=device)
        position = torch.tensor([tokens // 2], device=device)
        return Workload(model, (x,), kwargs={"input_pos": position}, no_grad=True)

    return build


# --- ThunderFX: graph breaks around einops rearranges -----------------------------------------------


def rearrange_with_breaks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rearranges alone between graph breaks (each its own subgraph), then compute."""
    from einops import rearrange

    y = rearrange(x, "b h s d -> b s (h d)")
    torch._dynamo.graph_break()
    y = torch.tanh(y @ w)
    print(end="")
    return rearrange(y, "b s (h d) -> (b h) s d", h=x.shape[1])


def _thunderfx(backward: bool) -> Callable[[str], Workload]:
    def build(device: str) -> Workload:
        b, h, s, d = (8, 16, 512, 64) if device == "cuda" else (2, 4, 32, 16)
        x = torch.randn(b, h, s, d, device=device, requires_grad=backward)
        w = (torch.randn(h * d, h * d, device=device) / (h * d) ** 0.5).requires_grad_(backward)
        options, guard = (dict(SHAPE_ONLY), dict(OVERRIDE)) if device == "cuda" else ({}, {})
        leaves = [x, w] if backward else []
        return Workload(
            rearrange_with_breaks, (x, w), backward, options, frontend="thunderfx", leaves=leaves, guard_options=guard
        )

    return build


# --- hoisting: litgpt Mistral's sliding-window mask loop feeding a softmax, at several T ---

# Mask sizes T (one setitem per row): small, medium, large.
HOIST_MASK_SIZES = {"cpu": (16, 32, 64), "cuda": (64, 256, 512)}


def _window_mask_softmax(x):
    """Mistral's mask: full(-inf), a window of zeros set row by row, added to attention scores."""
    t = x.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device)
    for i in range(t):
        mask[i, max(0, i - t // 4 + 1) : i + 1] = 0.0
    return torch.softmax(x + mask, dim=-1)


def _hoist_mask(index: int) -> Callable[[str], Workload]:
    def build(device: str) -> Workload:
        t = HOIST_MASK_SIZES["cuda" if device == "cuda" else "cpu"][index]
        return Workload(_window_mask_softmax, (torch.randn(1, 4, t, t, device=device),))

    return build


HOIST_CASES = [
    BenchCase("micro", f"mask-softmax-{size}", _hoist_mask(i)) for i, size in enumerate(("small", "medium", "large"))
]


CASES: list[BenchCase] = [
    *(BenchCase("micro", f"{op}-{size}", _micro(op, size)) for op in MICRO_OPS for size in ("small", "large")),
    *(
        BenchCase("micro", f"{op}-{size}-shapeonly", _micro(op, size, shape_only=True), cuda_only=True)
        for op in VIEW_OPS
        for size in ("small", "large")
    ),
    BenchCase("models", "nanogpt-block-fwd", _nanogpt_block(backward=False)),
    BenchCase("models", "nanogpt-block-fwdbwd", _nanogpt_block(backward=True)),
    *(BenchCase("models", f"litgpt-{key}-fwdbwd", _litgpt(name), heavy=True) for key, name in LITGPT_MODELS.items()),
    BenchCase("models", "litgpt-llama2-decode", _litgpt_decode("Llama-2-7b-hf"), heavy=True),
    BenchCase("thunderfx", "einops-breaks-fwd", _thunderfx(backward=False)),
    BenchCase("thunderfx", "einops-breaks-fwdbwd", _thunderfx(backward=True)),
    *HOIST_CASES,
]


def case_named(name: str) -> BenchCase:
    """The case called ``name`` (``KeyError`` listing the names if there is none)."""
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no benchmark case {name!r}; cases: {[c.name for c in CASES]}")


def select(
    suites: list[str] | None = None, names: list[str] | None = None, heavy: bool = False, device: str | None = None
) -> list[BenchCase]:
    """The cases of ``suites`` whose name contains one of ``names``; heavy ones only with ``heavy``; CUDA-only
    ones only when ``device`` is cuda or not given."""
    return [
        c
        for c in CASES
        if (suites is None or c.suite in suites)
        and (not names or any(n in c.name for n in names))
        and (heavy or not c.heavy)
        and (device in (None, "cuda") or not c.cuda_only)
    ]


def compile_variant(workload: Workload, variant: str, device: str) -> Callable[..., Any]:
    """The callable one variant runs: the eager function, Thunder's (with a FusionGuard if guarded), or Inductor's."""
    if variant == "eager":
        return workload.fn
    if variant not in ALL_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; allowed: {', '.join(ALL_VARIANTS)}")
    if variant in INDUCTOR_MODES:
        return torch.compile(workload.fn, mode=INDUCTOR_MODES[variant])
    from ..transform import FusionGuard

    return thunder_compile(workload, device, [FusionGuard(**workload.guard_options)] if variant == "guarded" else [])


def thunder_compile(workload: Workload, device: str, transforms: list[Any]) -> Callable[..., Any]:
    """``workload.fn`` compiled by Thunder (``thunder.jit`` or ThunderFX, as the workload says) with ``transforms``;
    off CUDA with Thunder's torch.compile executor, the fusion executor that runs there."""
    options: dict[str, Any] = dict(workload.jit_options)
    if device != "cuda":
        from thunder.executors.torch_compile import torch_compile_ex

        options["executors"] = [torch_compile_ex]
    options["transforms"] = list(transforms)
    if workload.frontend == "thunderfx":
        from thunder.dynamo import thunderfx

        return thunderfx(workload.fn, **options)
    import thunder

    return thunder.jit(workload.fn, **options)


def fresh_compile_state() -> None:
    """Forget what ``torch.compile`` compiled before (``torch._dynamo.reset()``), as a new process would.

    Between cases, so that one case's programs never count against another's recompile limit and a shape
    seen before never makes ``torch.compile`` compile the next case with dynamic shapes.
    """
    torch._dynamo.reset()


def make_step(workload: Workload, variant: str, device: str) -> Callable[[], None]:
    """One timed step of a variant: forward (and backward, for training cases), synchronised on CUDA.

    ``inductor-ro`` on CUDA marks each step as a new iteration for Inductor's CUDA graphs.
    """
    return step_of(workload, compile_variant(workload, variant, device), variant, device, sync=device == "cuda")


def step_of(workload: Workload, fn: Callable[..., Any], variant: str, device: str, sync: bool) -> Callable[[], None]:
    """A step running ``fn`` (``workload``'s function as ``variant`` compiled it) on the workload's inputs;
    ``sync``: wait for the device at the end."""
    args, kwargs, leaves = workload.args, workload.kwargs, workload.leaves
    mark_step = device == "cuda" and variant == "inductor-ro"

    def step() -> None:
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        if workload.no_grad:
            with torch.no_grad():
                fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
            if workload.backward:
                flat = tree_flatten(out)[0]
                loss = sum(t.float().sum() for t in flat if isinstance(t, torch.Tensor) and t.requires_grad)
                torch.autograd.grad(loss, leaves, allow_unused=True)
        if sync:
            torch.cuda.synchronize()

    return step
