"""The decision-accuracy corpus: lone ops and short chains by size, OpInfo samples, nanoGPT and litgpt steps."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

GROUPS = ("ops", "nanogpt", "litgpt", "opinfo")
LITGPT_CONFIGS = ("Llama-2-7b-hf", "phi-2")


@dataclass(frozen=True)
class Program:
    """One program of the corpus: ``build(device)`` gives (callable, args, backward, jit options)."""

    group: str
    name: str
    build: Callable[[str], tuple[Callable, tuple, bool, dict]]

    @property
    def split(self) -> str:
        digest = hashlib.sha256(f"{self.group}:{self.name}".encode()).digest()
        return "tune" if digest[0] % 2 == 0 else "holdout"


SIZES_KIB = (4, 256, 4096, 32768)


def _shape(kib: int) -> tuple[int, int]:
    numel = kib * 256
    cols = min(1024, numel)
    return numel // cols, cols


def _tail(x, b, r):
    return r + torch.nn.functional.gelu(x + b)


def _layer_norm(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:])


def _view_permute_softmax(x):
    return torch.softmax(x.view(x.shape[0], -1, 8).permute(0, 2, 1), dim=-1)


def _chain(x, y):
    return torch.where(x > 0, x + y, x - y).abs()


# name -> (function, how many (rows, cols) float inputs, extra inputs builder)
OPS: dict[str, tuple[Callable, Callable[[tuple[int, int], str], tuple]]] = {
    "add": (lambda x, y: x + y, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "mul": (lambda x, y: x * y, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "cast": (lambda x: x.to(torch.bfloat16), lambda s, d: (torch.randn(s, device=d),)),
    "copy_": (lambda dst, src: dst.copy_(src), lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "where": (
        lambda c, x, y: torch.where(c, x, y),
        lambda s, d: (torch.rand(s, device=d) < 0.5, torch.randn(s, device=d), torch.randn(s, device=d)),
    ),
    "softmax": (lambda x: torch.softmax(x, -1), lambda s, d: (torch.randn(s, device=d),)),
    "layer_norm": (_layer_norm, lambda s, d: (torch.randn(s, device=d),)),
    "sum": (lambda x: x.sum(-1), lambda s, d: (torch.randn(s, device=d),)),
    "gelu-tail": (
        _tail,
        lambda s, d: (torch.randn(s, device=d), torch.randn(s[-1], device=d), torch.randn(s, device=d)),
    ),
    "add-where-abs": (_chain, lambda s, d: (torch.randn(s, device=d), torch.randn(s, device=d))),
    "view-permute-softmax": (_view_permute_softmax, lambda s, d: (torch.randn(s, device=d),)),
}


def _op_program(op: str, kib: int) -> Program:
    fn, make = OPS[op]

    def build(device: str):
        torch.manual_seed(0)
        options = {"nv_enable_shape_only_fusion": True} if device == "cuda" else {}
        return fn, make(_shape(kib), device), False, options

    return Program("ops", f"{op}-{kib}KiB", build)


def _nanogpt(device: str):
    from thunder.tests.nanogpt_model import Block, GPTConfig

    cuda = device == "cuda"
    torch.manual_seed(0)
    config = GPTConfig(n_embd=768 if cuda else 64, n_head=12 if cuda else 4, block_size=512, dropout=0.0)
    batch, tokens = (4, 512) if cuda else (2, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    block = Block(config).to(device=device, dtype=dtype)
    x = torch.randn(batch, tokens, config.n_embd, device=device, dtype=dtype, requires_grad=True)
    return block, (x,), True, {}


def _litgpt(name: str) -> Callable[[str], tuple]:
    def build(device: str):
        import litgpt
        from litgpt.model import GPT

        torch.manual_seed(0)
        config = litgpt.Config.from_name(name, n_layer=1)
        with torch.device(device):
            model = GPT(config).to(torch.bfloat16)
        model.max_seq_length = 512
        x = torch.randint(0, config.padded_vocab_size, (1, 512), device=device)
        return model, (x,), True, {}

    return build


def _opinfo_programs(device: str, every: int = 6) -> list[Program]:
    import thunder.core.devices as devices
    import thunder.core.dtypes as dtypes
    from thunder.tests.opinfos import opinfos

    devicetype = devices.to_device(device).devicetype
    ops = [o for o in opinfos if devicetype in o.devicetypes() and dtypes.float32 in o.dtypes()]
    programs = []
    for op in ops[::every]:

        def build(device: str, op=op):
            torch.manual_seed(0)
            sample = next(iter(op.sample_inputs(device, dtypes.float32, requires_grad=False)))
            if sample.kwargs:
                kwargs = dict(sample.kwargs)
                return (lambda *a: op.op(*a, **kwargs)), tuple(sample.args), False, {}
            return op.op, tuple(sample.args), False, {}

        programs.append(Program("opinfo", op.name, build))
    return programs


def corpus(device: str, groups: Sequence[str] = GROUPS, quick: bool = False) -> list[Program]:
    """The programs of ``groups`` for ``device``; ``quick``: two small ops only (for tests)."""
    if quick:
        return [_op_program("add", 4), _op_program("softmax", 4)]
    programs: list[Program] = []
    if "ops" in groups:
        programs += [_op_program(op, kib) for op in OPS for kib in SIZES_KIB]
    if "nanogpt" in groups:
        programs.append(Program("nanogpt", "block-fwdbwd", _nanogpt))
    if "litgpt" in groups and device == "cuda":
        programs += [Program("litgpt", f"{name}-1layer-fwdbwd", _litgpt(name)) for name in LITGPT_CONFIGS]
    if "opinfo" in groups:
        programs += _opinfo_programs(device)
    return programs
