"""Thunder 0.2.6's failures on the zoo's third-party models (thunder_fusion_guard/bench/zoo_models.py), each as the
smallest program we found that shows it on CPU (torch.compile executor). Each test runs its program unguarded and
with ``FusionGuard()``: under ``thunder.jit`` the same exception both times (Thunder's interpreter fails before the
guard sees a trace, so it neither causes nor hides it); under ThunderFX the guard rescues the subgraph Thunder
fails on, and records the same error (:func:`fails_unless_rescued`). A test that starts to fail here means Thunder
changed: update README's "Known Thunder limitations" with it."""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import thunder
import torch
import torch.nn.functional as F
from thunder.core.interpreter import InterpreterError
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard, fusion_executors


@pytest.fixture(params=["unguarded", "guarded"])
def transforms(request: pytest.FixtureRequest) -> list[Any]:
    """Thunder's transforms for each run of a test: none, then ``FusionGuard()``."""
    return [FusionGuard()] if request.param == "guarded" else []


@contextlib.contextmanager
def fails(kind: type[BaseException], match: str) -> Iterator[None]:
    """``pytest.raises(kind, match=match)``, where the exception must be a ``kind`` itself, not a subclass of it."""
    with pytest.raises(kind, match=match) as caught:
        yield
    assert type(caught.value) is kind, f"{type(caught.value).__name__}, not {kind.__name__}: {caught.value}"


@contextlib.contextmanager
def fails_unless_rescued(transforms: list[Any], kind: type[BaseException], match: str) -> Iterator[None]:
    """Under ThunderFX: unguarded, :func:`fails`; guarded, the program runs and the guard records one rescue of
    a subgraph whose reason is that error."""
    if not transforms:
        with fails(kind, match):
            yield
        return
    yield
    (rescue,) = [d for d in transforms[0].report.decisions if d.action == "rescue"]
    assert rescue.subgraph is not None and rescue.details["error_type"] == kind.__name__
    assert re.search(match, rescue.error.splitlines()[0]), rescue.error


def compiled(fn: Callable[..., Any], transforms: list[Any], path: str = "jit") -> Callable[..., Any]:
    """``fn`` through ``thunder.jit`` (path "jit") or ThunderFX (path "fx") with the CPU fusion executor."""
    jit = thunderfx if path == "fx" else thunder.jit
    return jit(fn, executors=fusion_executors("cpu"), transforms=transforms)


# thunder.jit: index_add has no gradient (the NequIP-style model's scatter-sum).


def test_index_add_grad(transforms):
    def scatter_sum(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.zeros(4, 3).index_add(0, index, src)

    src = torch.randn(5, 3, requires_grad=True)
    with fails(RuntimeError, match=r"Failed to find a gradient transform for bound symbol .* prims\.index_add"):
        compiled(scatter_sum, transforms)(src, torch.tensor([0, 1, 1, 3, 2])).sum().backward()


# thunder.jit: an in-place copy into a slice of a tensor made in the program, with grad (e3nn's tensor products
# write each path into a narrow of one output: with translate_library_ops() the narrow is a slice, and the
# e3nn-built NequIP fails so on an H100). Thunder's backward trace reads a value nothing defines: with the
# torch.compile executor its own check says so ("unknown proxy"); with Thunder's default executors the backward
# fails in its autograd bridge at a bare ``assert not args`` (thunder/executors/torch_autograd.py:113). Guarded,
# the tensor is computed by cat of what is copied into it, and the gradient is eager's.


def test_copy_into_a_slice_of_a_new_tensor_with_grad(transforms):
    def paths_into_one_output(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 8)
        out[:, 0:4].copy_(x @ w)
        return out.sin().sum()

    x, w = torch.randn(5, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    eager = torch.autograd.grad(paths_into_one_output(x, w), (x, w))
    if transforms:  # guarded: the new tensor computed by cat before Thunder differentiates (passes/copies_as_cat.py)
        for jitted in (
            compiled(paths_into_one_output, transforms),
            thunder.jit(paths_into_one_output, transforms=transforms),
        ):
            got = torch.autograd.grad(jitted(x, w), (x, w))
            for g, e in zip(got, eager, strict=True):
                torch.testing.assert_close(g, e)
        return
    with fails(AssertionError, match=r"unknown proxy t\d+ is used in"):
        torch.autograd.grad(compiled(paths_into_one_output, transforms)(x, w), (x, w))
    plain = thunder.jit(paths_into_one_output, transforms=transforms)  # Thunder's default executors
    with fails(AssertionError, match=r"^$"):
        torch.autograd.grad(plain(x, w), (x, w))


# thunder.jit: nn.MultiheadAttention's backward (the nn.TransformerEncoder of the zoo calls it with
# need_weights=False; F.multi_head_attention_forward then returns None as its second output).


def test_multihead_attention_backward(transforms):
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 3, 8)
    fn = compiled(lambda x: attention(x, x, x, need_weights=False)[0], transforms)
    with fails(NotImplementedError, match="automatic registration for <function multi_head_attention_forward"):
        fn(x).sum().backward()


# thunder.jit: setting an attribute of an object that is no input to a dict. Hugging Face's output capturing does
# this to its module-level `_active_collector` (a CompileableContextVar) in every model's forward (BERT, Llama).


class Holder:
    value: Any = None


HOLDER = Holder()


def test_setting_attribute_of_global_object_to_dict(transforms):
    def f(x: torch.Tensor) -> torch.Tensor:
        HOLDER.value = {}
        return x * 2

    with fails(AssertionError, match=r"trying to set \.value of ProvenanceRecord\("):
        compiled(f, transforms)(torch.randn(3))


def test_setting_attribute_of_global_object_to_dict_hf_collector(transforms):
    output_capturing = pytest.importorskip("transformers.utils.output_capturing")
    made = output_capturing.CompileableContextVar
    takes_default = "default" in inspect.signature(made).parameters  # transformers 5.3 asks for one
    collector = made("collector", None) if takes_default else made("collector")

    def f(x: torch.Tensor) -> torch.Tensor:
        collector.reset(collector.set({}))  # what transformers' capture_outputs does around a model's forward
        return x * 2

    with fails(AssertionError, match=r"trying to set \.global_var of ProvenanceRecord\("):
        compiled(f, transforms)(torch.randn(3))


@pytest.mark.slow  # 10-16 s a model and a run
@pytest.mark.parametrize("model", ["Bert", "Llama"])
def test_setting_attribute_of_global_object_to_dict_hf_models(transforms, model):
    transformers = pytest.importorskip("transformers")
    shape = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8}
    config = getattr(transformers, f"{model}Config")(
        vocab_size=16, max_position_embeddings=8, attn_implementation="eager", **shape
    )
    module = getattr(transformers, f"{model}Model")(config).eval()
    with fails(AssertionError, match=r"trying to set \.global_var of ProvenanceRecord\("):
        compiled(lambda ids: module(input_ids=ids, use_cache=False).last_hidden_state, transforms)(
            torch.randint(0, 16, (1, 4))
        )


# thunder.jit: a tensor's dtype is Thunder's own, never equal to a torch.dtype, so `w.dtype in [torch.float16,
# torch.bfloat16]` is False. T5's layer norm then skips its cast back to bf16 and the next linear gets float32.
# (It is also why Mixtral takes transformers' grouped-mm fallback: `weight.dtype != torch.bfloat16` holds.)


FLOAT32_INTO_BF16_LINEAR = r"Expected a\.dtype=thunder\.dtypes\.float32 and w\.dtype=thunder\.dtypes\.bfloat16"


def test_dtype_compared_with_torch_dtype(transforms):
    def norm_then_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        if w.dtype in [torch.float16, torch.bfloat16]:
            h = h.to(w.dtype)
        return F.linear(h, w)

    x, w = torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(3, 4, dtype=torch.bfloat16)
    with fails(RuntimeError, match=FLOAT32_INTO_BF16_LINEAR):
        compiled(norm_then_linear, transforms)(x, w)


def test_dtype_compared_with_torch_dtype_t5_layer_norm(transforms):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    block = torch.nn.Sequential(t5.T5LayerNorm(4), torch.nn.Linear(4, 3, bias=False)).to(torch.bfloat16)
    with fails(RuntimeError, match=FLOAT32_INTO_BF16_LINEAR):
        compiled(block, transforms)(torch.randn(2, 4, dtype=torch.bfloat16))


# thunder.jit: a torch.library custom op Thunder was not told about (Mixtral's experts call
# transformers::grouped_mm_fallback).


@torch.library.custom_op("tfg_limitations::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_unregistered_custom_op(transforms):
    with fails(InterpreterError, match=r"tfg_limitations\.double is not registered"):
        compiled(lambda x: torch.ops.tfg_limitations.double(x), transforms)(torch.randn(3))


def test_unregistered_custom_op_hf_grouped_mm(transforms):
    pytest.importorskip("transformers.integrations.moe")  # registers transformers::grouped_mm_fallback
    tokens, weight, offsets = torch.randn(4, 3), torch.randn(2, 3, 5), torch.tensor([1, 4])
    fn = compiled(lambda a, b, o: torch.ops.transformers.grouped_mm_fallback(a, b, o), transforms)
    with fails(InterpreterError, match=r"transformers\.grouped_mm_fallback is not registered"):
        fn(tokens, weight, offsets)


# thunder.jit: `Tensor.layout` (PyG's GATConv asks it in remove_self_loops).


def test_tensor_layout(transforms):
    with fails(AttributeError, match="Unknown attribute layout"):
        compiled(lambda x: x * 2 if x.layout == torch.strided else x, transforms)(torch.randn(3))


def test_tensor_layout_pyg_gat(transforms):
    gat_conv = pytest.importorskip("torch_geometric.nn").GATConv
    conv = gat_conv(4, 2, heads=2).eval()
    edges = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    with fails(AttributeError, match="Unknown attribute layout"):
        compiled(conv, transforms)(torch.randn(5, 4), edges)


# ThunderFX (and thunder.jit): inputs that alias with different sizes (an index and its expand) in a program with an
# in-place op: Thunder's alias updates reshape one into the other's shape. ThunderFX hands Thunder such a subgraph
# in PyG's GATConv (edge_index[1] and edge_index[1].view(-1, 1).expand_as(alpha) around scatter_add_).


@pytest.mark.parametrize("path", ["fx", "jit"])
def test_aliased_inputs_of_different_sizes_with_inplace(transforms, path):
    def f(buffer: torch.Tensor, expanded: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        buffer.add_(1)
        return expanded + index[:, None]

    index = torch.tensor([0, 1, 1])
    match = r"Attempting to reshape a\.shape=\(3.*\) to shape=\(3.*\), but a\.numel"
    failing = fails(RuntimeError, match) if path == "jit" else fails_unless_rescued(transforms, RuntimeError, match)
    with failing:
        compiled(f, transforms, path)(torch.zeros(2), index.view(-1, 1).expand(3, 2), index)


@pytest.mark.slow  # 3-20 s a run: Dynamo and Inductor compile GATConv's pieces
def test_aliased_inputs_of_different_sizes_with_inplace_pyg_gat(transforms):
    gat_conv = pytest.importorskip("torch_geometric.nn").GATConv
    conv = gat_conv(4, 2, heads=2).eval()
    edges = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    with fails_unless_rescued(transforms, RuntimeError, r"Attempting to reshape a\.shape=\(11, 2\) to shape=\(11,\)"):
        compiled(conv, transforms, "fx")(torch.randn(5, 4), edges)


@pytest.mark.slow  # 4-16 s a run: Dynamo, Inductor and transformers' imports
def test_aliased_inputs_of_different_sizes_with_inplace_hf_mixtral(transforms):
    """On CPU a tiny Mixtral under ThunderFX stops here; the zoo's bf16 Mixtral on an H100 stops earlier, at a
    stride assert (README)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=8, max_position_embeddings=8, num_local_experts=4, num_experts_per_tok=2,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 16, (4, 4))
    match = r"Attempting to reshape a\.shape=\(4, 4\) to shape=\(1, 4\), but a\.numel"
    with fails_unless_rescued(transforms, RuntimeError, match):
        compiled(lambda ids: model(input_ids=ids, labels=ids, use_cache=False).loss, transforms, "fx")(ids)
