"""e3nn's fully connected tensor products run by cuEquivariance's fused kernels, where they compute the same values
and, given example inputs, run faster.

A compiler sees an e3nn tensor product as dozens of small GEMMs and pointwise ops (one GEMM a path); NVIDIA's
cuequivariance-torch computes it in one kernel forward and one backward. :func:`fused_tensor_products` returns a
copy of the model whose ``e3nn.o3.FullyConnectedTensorProduct`` modules run so, sharing the model's parameters and
buffers: each replaced only where its values match e3nn's on the same inputs and, with example inputs, where its
forward and backward time faster by ``margin``; every module kept says why. The user's model is left as it was.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .measure.timing import interleaved_us
from .wording import error_line

__all__ = ["CueqTensorProduct", "TensorProducts", "fused_tensor_products"]

METHODS = ("fused_tp", "naive")
INSTALL = "pip install cuequivariance-torch (and cuequivariance-ops-torch-cu13 or -cu12 for its CUDA kernels)"


@dataclass
class TensorProducts:
    """What :func:`fused_tensor_products` did: the new ``model``, the qualified names of the tensor products it
    replaced and of those it kept with the reason (``kept``), the cuEquivariance method, and each timed module's
    forward + backward µs, e3nn's and cuEquivariance's medians (``timed_us``)."""

    model: nn.Module
    replaced: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    method: str = ""
    timed_us: dict[str, tuple[float, float]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One line a tensor product: replaced or kept, and why."""
        out = []
        for name in self.replaced:
            timed = self.timed_us.get(name)
            how = f": {timed[1]:.1f} µs against e3nn's {timed[0]:.1f}" if timed else " (not timed: no example inputs)"
            out.append(f"{name}: cuEquivariance ({self.method}){how}")
        out += [f"{name}: kept, {reason}" for name, reason in self.kept.items()]
        return out


class CueqTensorProduct(nn.Module):
    """An e3nn ``FullyConnectedTensorProduct`` computed by cuEquivariance's ``FullyConnectedTensorProduct`` in e3nn's
    layout: the same inputs (leading dimensions broadcast, as e3nn's), the same weights (its internal weight is the
    e3nn module's own parameter), the same output shape."""

    def __init__(self, e3nn_tp: nn.Module, method: str) -> None:
        import cuequivariance as cue
        import cuequivariance_torch as cuet

        super().__init__()
        dtype = _dtype_of(e3nn_tp)
        self.irreps_in1, self.irreps_in2, self.irreps_out = e3nn_tp.irreps_in1, e3nn_tp.irreps_in2, e3nn_tp.irreps_out
        self.weight_numel = e3nn_tp.weight_numel
        self.shared_weights = e3nn_tp.shared_weights
        self.internal_weights = e3nn_tp.internal_weights
        if self.internal_weights:  # the same Parameter object: state_dict keys, optimizers and values stay shared
            self.weight = e3nn_tp.weight
        self.fused = cuet.FullyConnectedTensorProduct(
            *(cue.Irreps("O3", str(irreps)) for irreps in (self.irreps_in1, self.irreps_in2, self.irreps_out)),
            layout=cue.mul_ir,
            shared_weights=self.shared_weights,
            internal_weights=False,
            device=_device_of(e3nn_tp),
            dtype=dtype,
            math_dtype=dtype,
            method=method,
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        if weight is None:
            weight = self.weight
        if self.shared_weights:  # one set of weights for the batch: cuEquivariance's batch of one
            lead = torch.broadcast_shapes(x.shape[:-1], y.shape[:-1])
            weight = weight.reshape(1, -1)
        else:
            lead = torch.broadcast_shapes(x.shape[:-1], y.shape[:-1], weight.shape[:-1])
            weight = weight.expand(*lead, weight.shape[-1]).reshape(-1, weight.shape[-1])
        x = x.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1])
        y = y.expand(*lead, y.shape[-1]).reshape(-1, y.shape[-1])
        return self.fused(x, y, weight).reshape(*lead, -1)


def fused_tensor_products(
    model: nn.Module, *args: Any, method: str | None = None, margin: float = 0.05, **kwargs: Any
) -> TensorProducts:
    """A copy of ``model`` (parameters and buffers shared) whose e3nn ``FullyConnectedTensorProduct`` modules run
    by cuEquivariance, each only where it computes e3nn's values and, given example ``args``/``kwargs`` (one call of
    ``model``, forward and backward, captures each module's inputs), runs faster by ``margin``. ``method``:
    cuEquivariance's "fused_tp" (its CUDA kernel; the default on CUDA) or "naive" (plain PyTorch; the default
    elsewhere). ModuleNotFoundError where cuequivariance-torch is not installed."""
    if method is not None and method not in METHODS:
        raise ValueError(f"fused_tensor_products: method={method!r}; allowed: None, {', '.join(map(repr, METHODS))}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"fused_tensor_products: margin={margin!r}; allowed: a number in [0, 1)")
    try:
        import cuequivariance_torch  # noqa: F401
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"fused_tensor_products needs cuequivariance-torch: {INSTALL}") from e
    from e3nn import o3

    candidates = {name: m for name, m in model.named_modules() if type(m) is o3.FullyConnectedTensorProduct}
    device = next((_device_of(m) for m in candidates.values()), torch.device("cpu"))
    method = method or ("fused_tp" if device.type == "cuda" else "naive")
    result = TensorProducts(model=model, method=method)
    if not candidates:
        return result
    calls = _calls(model, candidates, args, kwargs) if args or kwargs else {}
    chosen: dict[str, nn.Module] = {}
    for name, tp in candidates.items():
        reason = _unsupported(tp)
        if reason:
            result.kept[name] = reason
            continue
        try:
            fused = CueqTensorProduct(tp, method)
            inputs = calls.get(name) or _random_inputs(tp)
            difference = _differs(tp, fused, inputs)
        except Exception as e:  # cuEquivariance refused these irreps or this method here: keep e3nn's
            result.kept[name] = f"cuEquivariance failed: {error_line(e)}"
            continue
        if difference:
            result.kept[name] = difference
            continue
        if args or kwargs:
            if name not in calls:
                result.kept[name] = "not called by the example inputs"
                continue
            e3nn_us, cueq_us = _timed_us(tp, fused, calls[name])
            result.timed_us[name] = (e3nn_us, cueq_us)
            if cueq_us > e3nn_us * (1 - margin):
                result.kept[name] = f"not faster by margin {margin}: {cueq_us:.1f} µs against e3nn's {e3nn_us:.1f}"
                continue
        chosen[name] = fused
    if chosen:
        result.model = _shared_copy(model, chosen)
        result.replaced = list(chosen)
    return result


def _unsupported(tp: nn.Module) -> str:
    """Why cuEquivariance cannot compute this e3nn tensor product, or ''. Other normalizations than e3nn's default
    (cuEquivariance computes "component" and "element" only) are baked into e3nn's path weights: the value check
    finds them."""
    if tp.internal_weights and not tp.shared_weights:
        return "internal weights not shared"
    return ""


def _dtype_of(module: nn.Module) -> torch.dtype:
    for t in (*module.parameters(), *module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.get_default_dtype()


def _device_of(module: nn.Module) -> torch.device:
    return next((t.device for t in (*module.parameters(), *module.buffers())), torch.device("cpu"))


def _random_inputs(tp: nn.Module, batch: int = 7) -> tuple[torch.Tensor, ...]:
    """Inputs in the module's dtype and device, seeded: a batch of each operand and, unless internal, weights."""
    generator = torch.Generator().manual_seed(0)
    dtype, device = _dtype_of(tp), _device_of(tp)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)

    inputs = [rand(batch, tp.irreps_in1.dim), rand(batch, tp.irreps_in2.dim)]
    if not tp.internal_weights:
        inputs.append(rand(tp.weight_numel) if tp.shared_weights else rand(batch, tp.weight_numel))
    return tuple(inputs)


def _calls(
    model: nn.Module, modules: dict[str, nn.Module], args: Sequence[Any], kwargs: dict[str, Any]
) -> dict[str, tuple[Any, ...]]:
    """Each module's inputs ``(x, y[, weight])`` at its first call in one forward of ``model``, detached."""
    seen: dict[str, tuple[Any, ...]] = {}
    handles = []
    for name, module in modules.items():

        def hook(_module: nn.Module, inputs: tuple[Any, ...], named: dict[str, Any], name: str = name) -> None:
            given = (*inputs, *([named["weight"]] if "weight" in named else []))
            seen.setdefault(name, tuple(a.detach().clone() if torch.is_tensor(a) else a for a in given))

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _outputs_and_grads(module: nn.Module, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """The module's output and the gradients of a fixed projection of it with respect to its floating inputs."""
    xs = [a.detach().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() else a for a in inputs]
    out = module(*xs)
    projection = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).reshape(out.shape)
    wrt = [x for x in xs if torch.is_tensor(x) and x.requires_grad]
    grads = torch.autograd.grad((out * projection).sum(), wrt, allow_unused=True)
    return [out.detach(), *(g for g in grads if g is not None)]


def _differs(reference: nn.Module, candidate: nn.Module, inputs: Sequence[Any]) -> str:
    """'' where ``candidate`` computes ``reference``'s output and input gradients within rounding (64 units in the
    last place of the wider of the dtype and float32, relative to the largest value); else what differs."""
    ref, got = _outputs_and_grads(reference, inputs), _outputs_and_grads(candidate, inputs)
    for what, a, b in zip(("output", *("gradient",) * (len(ref) - 1)), ref, got, strict=False):
        if a.shape != b.shape:
            return f"cuEquivariance's {what} has shape {tuple(b.shape)} against e3nn's {tuple(a.shape)}"
        scale = max(1.0, float(a.abs().max())) if a.numel() else 1.0
        tolerance = 64 * max(torch.finfo(a.dtype).eps, torch.finfo(torch.float32).eps) * scale
        worst = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        if not math.isfinite(worst) or worst > tolerance:
            return f"cuEquivariance's {what} differs from e3nn's by {worst:.3g} (allowed {tolerance:.3g})"
    if len(ref) != len(got):
        return "cuEquivariance's gradients differ in number from e3nn's"
    return ""


def _timed_us(reference: nn.Module, candidate: nn.Module, inputs: Sequence[Any]) -> tuple[float, float]:
    """Median µs of one forward and backward (gradients of the inputs only: no parameter's ``.grad`` is touched)
    of each module on the same inputs, timed interleaved."""

    def step(module: nn.Module) -> Callable[[], None]:
        xs = [a.detach().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point() else a for a in inputs]
        wrt = [x for x in xs if torch.is_tensor(x) and x.requires_grad]

        def run() -> None:
            torch.autograd.grad(module(*xs).sum(), wrt, allow_unused=True)

        return run

    samples = interleaved_us([step(reference), step(candidate)], ())
    return sorted(samples[0])[len(samples[0]) // 2], sorted(samples[1])[len(samples[1]) // 2]


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` holding the same parameters, buffers, submodules and hooks in dicts of its own."""
    new = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, dict):
            setattr(new, key, copy.copy(value))
    return new


def _shared_copy(model: nn.Module, replaced: dict[str, nn.Module]) -> nn.Module:
    """``model`` with each module on the path to a replaced one copied (:func:`_shallow`; every parameter, buffer
    and untouched module shared), the replaced modules put in place."""
    root = _shallow(model)
    copied = {"": root}
    for name, new in replaced.items():
        *parents, leaf = name.split(".")
        owner, path = root, ""
        for part in parents:
            path = f"{path}.{part}" if path else part
            if path not in copied:
                copied[path] = owner._modules[part] = _shallow(owner._modules[part])
            owner = copied[path]
        owner._modules[leaf] = new
    return root
