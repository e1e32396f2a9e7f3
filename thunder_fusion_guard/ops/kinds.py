"""What kind of work an op, a fusion region or a kernel does, from names alone, so that two compilers' work on
the same program can be set side by side: Thunder's regions (their ops), aten ops, Inductor's kernels (their
names list the fused aten ops) and library kernels (cuBLAS, flash attention, cuDNN) land in the same kinds."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["WORK_KINDS", "compute_bound", "work_kind"]

# The kinds, most telling first: a region holding a norm and the elementwise ops around it is a norm.
WORK_KINDS = (
    "attention",
    "matmul",
    "loss",
    "norm",
    "rope",
    "activation",
    "softmax",
    "embedding",
    "reduction",
    "elementwise",
    "copy",
    "other",
)

_TOKEN = re.compile(r"[a-z0-9]+")
_ATTENTION = ("attention", "sdpa", "fmha", "flash", "sdpfa", "sdpea", "cudnn_sdp")
_MATMUL_EXACT = {"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "gemm", "gemv", "dot", "einsum"}
_MATMUL_PARTS = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "wgmma", "matmul")
_LOSS = {"nll", "cross", "logsumexp"}
_NORM = {"rsqrt", "var", "norm", "layernorm", "rmsnorm", "batchnorm", "groupnorm"}
_ACTIVATION = {"silu", "sigmoid", "gelu", "erf", "tanh", "relu", "swish", "mish", "softplus", "elu", "hardtanh"}
_SOFTMAX = {"softmax", "amax"}
_EMBEDDING = {"embedding", "take", "gather"}
_REDUCTION = {"sum", "mean", "prod", "amin", "max", "min", "reduction", "reduce", "argmax", "argmin", "cumsum"}
_ELEMENTWISE = {
    "add", "sub", "mul", "div", "neg", "exp", "log", "pow", "where", "abs", "sqrt", "reciprocal", "maximum",
    "minimum", "clamp", "ge", "gt", "le", "lt", "eq", "ne", "pointwise", "elementwise", "fill", "full", "iota",
    "remainder", "fmod", "sin", "cos", "logical", "bitwise", "masked", "true", "floor", "ceil", "round", "trunc",
}  # fmt: skip
_COPY = {
    "copy", "clone", "cat", "memcpy", "memset", "contiguous", "convert", "to", "stack", "pad", "transpose", "reshape",
    "view", "permute", "broadcast", "expand", "slice", "squeeze", "unsqueeze", "split", "flatten",
}  # fmt: skip


def _tokens(names: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for name in names:
        lowered = name.lower()
        found.update(_TOKEN.findall(lowered))
        found.update(part for part in re.split(r"[^a-z0-9_]+", lowered) if part)
    return found


def work_kind(names: Iterable[str]) -> str:
    """The kind (one of :data:`WORK_KINDS`) of the work done by ops or kernels with these ``names``.

    ``names`` may be Thunder op names (``prims.rsqrt``, ``ltorch.silu``), aten ops (``aten::mm``), Inductor
    kernels (``triton_red_fused__to_copy_mean_mul_pow_rsqrt_0``) or library kernels (``nvjet_sm90_tst_...``,
    ``flash_fwd_kernel``); the most telling kind found wins.
    """
    names = list(names)
    tokens = _tokens(names)
    text = " ".join(n.lower() for n in names)
    if any(a in text for a in _ATTENTION):
        return "attention"
    if tokens & _MATMUL_EXACT or any(p in text for p in _MATMUL_PARTS):
        return "matmul"
    if tokens & _LOSS or "log_softmax" in text or "cross_entropy" in text:
        return "loss"
    if tokens & _NORM or "layer_norm" in text or "rms_norm" in text or "var_mean" in text:
        return "norm"
    if "neg" in tokens and tokens & {"cat", "pad"}:  # rotate half: -x2 next to x1 (the backward pads)
        return "rope"
    if tokens & _ACTIVATION:
        return "activation"
    if tokens & _SOFTMAX:
        return "softmax"
    if tokens & _EMBEDDING or "index_select" in text:
        return "embedding"
    if tokens & _REDUCTION:
        return "reduction"
    if "direct_copy" in text or "copy_kernel" in text:
        return "copy"
    if tokens & _ELEMENTWISE:
        return "elementwise"
    if tokens & _COPY or "to_copy" in text or "convert_element_type" in text:
        return "copy"
    return "other"


_CONVOLUTION = {"convolution", "conv", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d"}


def compute_bound(names: Iterable[str]) -> list[str]:
    """Those of ``names`` (op names, ``prims.convolution``) whose work is arithmetic more than memory traffic: a
    convolution, a matrix product, attention; each once, in order. Computing one again costs its FLOPs, not only
    its reads and writes."""
    found = []
    for name in dict.fromkeys(names):
        tokens = _tokens([name])
        if tokens & (_MATMUL_EXACT | _CONVOLUTION) or any(a in name.lower() for a in _ATTENTION):
            found.append(name)
    return found
