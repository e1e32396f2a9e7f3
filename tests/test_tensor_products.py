"""fused_tensor_products: e3nn's fully connected tensor products run by cuEquivariance where they compute the same
values and, given example inputs, time faster (timings injected: no verdict here depends on a real clock)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

pytest.importorskip("e3nn")
pytest.importorskip("cuequivariance_torch")

from e3nn import o3

import thunder_fusion_guard.tensor_products as tps
from thunder_fusion_guard import fused_tensor_products
from thunder_fusion_guard.bench.zoo_equivariant import E3nnNequIP, _atoms


def small_nequip(layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return E3nnNequIP(channels=4, layers=layers).eval(), _atoms("cpu")


def energy_and_forces(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    pos = inputs[0].detach().requires_grad_(True)
    energy = module(pos, *inputs[1:])
    (forces,) = torch.autograd.grad(energy, pos)
    return energy.detach(), forces


def timed(e3nn_us: float, cueq_us: float):
    calls = []

    def fake(reference, candidate, inputs):
        calls.append(inputs)
        return e3nn_us, cueq_us

    return fake, calls


def tp_names(module: nn.Module) -> dict[str, type]:
    return {n: type(m) for n, m in module.named_modules() if n.endswith(".tp")}


def test_untimed_every_tensor_product_runs_by_cuequivariance_with_e3nns_values_and_the_model_unchanged():
    model, inputs = small_nequip()
    before = tp_names(model)
    result = fused_tensor_products(model)
    assert result.replaced == ["interactions.0.tp", "interactions.1.tp"] and result.kept == {}
    assert result.method == "naive" and result.timed_us == {}  # on CPU cuEquivariance's plain PyTorch method
    assert set(tp_names(result.model).values()) == {tps.CueqTensorProduct}
    assert tp_names(model) == before and set(before.values()) == {o3.FullyConnectedTensorProduct}
    # parameters shared, not copied: training the new model trains the user's
    old = dict(model.named_parameters())
    assert all(p is old[n] for n, p in result.model.named_parameters() if n in old)
    assert result.model.embed.weight is model.embed.weight
    (e0, f0), (e1, f1) = energy_and_forces(model, inputs), energy_and_forces(result.model, inputs)
    torch.testing.assert_close(e1, e0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(f1, f0, rtol=1e-5, atol=1e-6)


def test_with_example_inputs_only_the_faster_by_margin_are_replaced(monkeypatch):
    model, inputs = small_nequip()
    fake, calls = timed(100.0, 50.0)
    monkeypatch.setattr(tps, "_timed_us", fake)
    faster = fused_tensor_products(model, *inputs)
    assert faster.replaced == ["interactions.0.tp", "interactions.1.tp"]
    assert faster.timed_us == {n: (100.0, 50.0) for n in faster.replaced}
    # each timed on the inputs it got in the model's call: the gathered features of every edge
    edges = inputs[2].shape[0]
    assert len(calls) == 2 and all(c[0].shape[0] == edges and c[1].shape[0] == edges for c in calls)

    monkeypatch.setattr(tps, "_timed_us", timed(100.0, 96.0)[0])
    level = fused_tensor_products(model, *inputs, margin=0.05)
    assert level.replaced == [] and set(level.kept) == {"interactions.0.tp", "interactions.1.tp"}
    assert level.model is model  # nothing replaced: the user's model itself
    assert fused_tensor_products(model, *inputs, margin=0.0).replaced == faster.replaced


def test_a_tensor_product_the_example_never_calls_is_kept(monkeypatch):
    class TwoProducts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = o3.FullyConnectedTensorProduct("2x0e + 1x1o", "1x0e + 1x1o", "2x0e + 1x1o")
            self.unused = o3.FullyConnectedTensorProduct("2x0e", "1x0e", "1x0e")

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.used(x, y)

    monkeypatch.setattr(tps, "_timed_us", timed(100.0, 10.0)[0])
    model = TwoProducts()
    result = fused_tensor_products(model, torch.randn(5, 5), torch.randn(5, 4))
    assert result.replaced == ["used"] and list(result.kept) == ["unused"]
    assert type(result.model.unused) is o3.FullyConnectedTensorProduct


def test_internal_weights_stay_the_users_parameter_and_leading_dimensions_broadcast():
    torch.manual_seed(0)
    tp = o3.FullyConnectedTensorProduct("3x0e + 2x1o + 1x2e", "1x0e + 1x1o", "2x0e + 2x1o")
    holder = nn.Sequential(tp)
    result = fused_tensor_products(holder)
    fused = result.model[0]
    assert result.replaced == ["0"] and fused.weight is tp.weight
    x, y = torch.randn(2, 3, tp.irreps_in1.dim), torch.randn(3, tp.irreps_in2.dim)
    torch.testing.assert_close(fused(x, y), tp(x, y), rtol=1e-5, atol=1e-6)
    fused(x, y).sum().backward()
    assert tp.weight.grad is not None  # the gradient reaches the user's parameter


def test_per_call_weights_broadcast_as_e3nns():
    torch.manual_seed(0)
    tp = o3.FullyConnectedTensorProduct("2x0e + 1x1o", "1x0e + 1x1o", "1x0e + 1x1o", shared_weights=False)
    fused = fused_tensor_products(tp).model
    x, y, w = torch.randn(4, 5), torch.randn(1, 4), torch.randn(4, tp.weight_numel)
    torch.testing.assert_close(fused(x, y, w), tp(x, y, w), rtol=1e-5, atol=1e-6)


def test_what_cuequivariance_does_not_compute_is_kept_with_its_reason(monkeypatch):
    norm = o3.FullyConnectedTensorProduct("2x0e + 1x1o", "1x0e + 1x1o", "1x0e", irrep_normalization="norm")
    result = fused_tensor_products(nn.Sequential(norm))
    assert result.replaced == [] and list(result.kept) == ["0"]  # cuEquivariance's normalization only: other values

    # values that differ by more than rounding: kept, whatever the timing would say
    original = tps.CueqTensorProduct.forward
    monkeypatch.setattr(tps.CueqTensorProduct, "forward", lambda self, *a: original(self, *a) * (1 + 1e-3))
    monkeypatch.setattr(tps, "_timed_us", timed(100.0, 1.0)[0])
    model, inputs = small_nequip(layers=1)
    differs = fused_tensor_products(model, *inputs)
    assert differs.replaced == [] and list(differs.kept) == ["interactions.0.tp"]
    assert differs.timed_us == {}  # refused before any timing


def test_bad_options_and_a_missing_library_say_so_in_one_line(monkeypatch):
    model, _ = small_nequip(layers=1)
    with pytest.raises(ValueError, match="method='fast'"):
        fused_tensor_products(model, method="fast")
    for margin in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(ValueError, match="margin="):
            fused_tensor_products(model, margin=margin)
    monkeypatch.setitem(sys.modules, "cuequivariance_torch", None)
    with pytest.raises(ModuleNotFoundError, match="pip install cuequivariance-torch"):
        fused_tensor_products(model)


def test_the_guard_runs_the_converted_model_under_thunderfx_with_its_forces():
    """The converted model under guarded ThunderFX, translated: forces as the converted model's in eager."""
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import Costs, FusionGuard, library_ops_translated

    model, inputs = small_nequip(layers=1)
    converted = fused_tensor_products(model).model
    want = energy_and_forces(converted, inputs)
    guard = FusionGuard(costs=Costs(measure_budget_s=0))
    with library_ops_translated():
        got = energy_and_forces(thunderfx(converted, transforms=[guard]), inputs)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    unrescued = [d for d in guard.report.decisions if "error_type" in d.details and "rescued_by" not in d.details]
    assert not unrescued
