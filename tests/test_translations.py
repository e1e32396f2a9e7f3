"""Translations of library ops Thunder only registered automatically (``narrow``, ``tensordot``,
``broadcast_tensors``, the 2-norm), the gradient of ``index_add`` and e3nn's ``Extract`` out of place: op by op
against torch, values and gradients in fp32 and bf16, and ``narrow`` out of range raises torch's error; ThunderFX
keeps the ops in Thunder only while they are in place; ``why_not_fused`` names the translation; the e3nn-built
NequIP trains as one Thunder program."""

from __future__ import annotations

import pytest
import thunder
import torch
from thunder.dynamo import thunderfx

from thunder_fusion_guard import (
    Costs,
    library_ops_translated,
    translate_library_ops,
    untranslate_library_ops,
    why_not_fused,
)
from thunder_fusion_guard._thunder import thunderfx_split_ops, thunderfx_subgraphs

CASES = {
    "narrow": (lambda a, b: a.narrow(1, 2, 3) * b[0, :3], [(4, 6), (3, 5)]),
    "narrow negative start": (lambda a, b: torch.narrow(a, 0, -2, 1)[:, :5] * b[:1], [(4, 6), (3, 5)]),
    # start -size with all of dim -1; start at the end with length 0 (nothing): torch's bounds, inclusive
    "narrow at the bounds": (
        lambda a, b: a.narrow(-1, -6, 6)[:3, :5] * b + torch.narrow(b, 0, 3, 0).sum(),
        [(4, 6), (3, 5)],
    ),
    "tensordot dims lists": (lambda a, b: torch.tensordot(a.narrow(1, 0, 3), b, dims=([1], [0])), [(4, 6), (3, 5)]),
    "tensordot dims int": (lambda a, b: torch.tensordot(a, b, dims=1), [(4, 3), (3, 5)]),
    "tensordot e3nn": (lambda a, b: torch.tensordot(a, b, dims=([0, 1], [1, 2])), [(2, 3, 4), (5, 2, 3)]),
    "index_add": (lambda a, b: a.index_add(0, torch.tensor([0, 2, 2]), b), [(4, 5), (3, 5)]),
    "broadcast_tensors": (lambda a, b: torch.broadcast_tensors(a[:, :1], b)[0] * b, [(4, 6), (4, 5)]),
    # a row of zeros: torch's gradient there is 0, where a sum of squares' would be NaN
    "norm dim": (lambda a, b: (a * (torch.arange(4) > 0)[:, None]).norm(dim=1) * b[:, 0], [(4, 3), (4, 2)]),
    "norm of all": (lambda a, b: torch.norm(a) * b.sum(), [(4, 3), (2,)]),
    "vector_norm keepdim": (lambda a, b: torch.linalg.vector_norm(a, dim=(0, 1), keepdim=True) * b, [(2, 3), (4, 1)]),
}


def _inputs(shapes, dtype):
    torch.manual_seed(0)
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def _step(fn, args):
    out = fn(*args)
    return [out, *torch.autograd.grad((out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum(), args)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_each_translation_gives_torchs_values_and_gradients(case, dtype):
    fn, shapes = CASES[case]
    args = _inputs(shapes, dtype)
    with library_ops_translated():
        jitted = thunder.jit(fn)
        got = _step(jitted, args)
    ids = {str(b.sym.id) for b in thunder.last_traces(jitted)[0].bound_symbols}
    if "index_add" not in case:  # Thunder traced the translation, not its automatic registration
        assert {i for i in ids if i.startswith("thunder_fusion_guard.")}, ids
    want = _step(fn, args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)  # the dtype's own tolerance: bf16 rounds in matmul's accumulation
    if ("narrow" in case and "tensordot" not in case) or case == "broadcast_tensors":
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))  # a slice, an expand: the same bits


# Calls torch's narrow raises on (shape, dim, start, length): torch checks a 0-dim tensor, then the length, the dim,
# start within [-size, size], then start (counted from the end where negative) + length against the size.
NARROW_ERRORS = {
    "start + length past the end": ((6, 2), 0, 4, 5),
    "negative start + length past the end": ((6, 2), 0, -2, 3),
    "start at the end, length 1": ((6, 2), 0, 6, 1),
    "start below -size": ((6, 2), 0, -7, 1),
    "start past the end, length 0": ((6, 2), -1, 3, 0),
    "negative length": ((6, 2), 0, 0, -1),
    "negative length, dim out of range": ((6, 2), 5, 9, -1),
    "dim past the last": ((6, 2), 2, 0, 1),
    "negative dim before the first": ((6, 2), -3, 0, 1),
    "0-dim tensor": ((), 0, 0, 0),
}


def _eager_error(fn, *args) -> Exception:
    with pytest.raises(Exception) as raised:
        fn(*args)
    return raised.value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(NARROW_ERRORS))
def test_narrow_out_of_range_raises_torchs_error_under_thunder_jit(case, dtype):
    """Where torch's narrow raises, the translation raises the same error, of torch's type with torch's message
    (a slice would clamp the request: ``x.narrow(0, 4, 5)`` of 6 rows gave 2), called as a function and as a method;
    before the translation Thunder's registration raised a NotImplementedError around it."""
    shape, dim, start, length = NARROW_ERRORS[case]
    x = torch.randn(shape, dtype=dtype)
    for fn in (lambda x: torch.narrow(x, dim, start, length) * 2, lambda x: x.narrow(dim, start, length) * 2):
        want = _eager_error(fn, x)
        with library_ops_translated():
            got = _eager_error(thunder.jit(fn), x)
        assert (type(got), str(got)) == (type(want), str(want))


@pytest.mark.parametrize("case", list(NARROW_ERRORS))
def test_narrow_out_of_range_under_thunderfx_raises_dynamos_error_naming_torchs(case):
    """Under ThunderFX, Dynamo runs the graph on fake tensors before Thunder sees it and raises first, translated or
    not: a TorchRuntimeError (a RuntimeError, also where torch's error is an IndexError) naming torch's error."""
    torch._dynamo.reset()  # else Dynamo, seeing fn's code again, makes its ints symbolic and names them so
    shape, dim, start, length = NARROW_ERRORS[case]
    x = torch.randn(shape)

    def fn(x):
        return x.narrow(dim, start, length) * 2

    want = _eager_error(fn, x)
    with library_ops_translated():
        got = _eager_error(thunderfx(fn), x)
    assert isinstance(got, torch._dynamo.exc.TorchRuntimeError), repr(got)
    assert f"got {type(want).__name__}({str(want)!r})" in str(got), str(got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_under_thunderfx_gives_torchs_values_and_gradients(dtype):
    """Valid calls at torch's bounds (negative dim and start, start -size, start at the end with length 0), kept in
    Thunder by ThunderFX: the same bits as torch, values and gradients."""
    fn, shapes = CASES["narrow at the bounds"]
    args = _inputs(shapes, dtype)
    with library_ops_translated():
        compiled = thunderfx(fn)
        got = _step(compiled, args)
    assert thunderfx_split_ops(compiled) == []
    assert all(torch.equal(g, w) for g, w in zip(got, _step(fn, args), strict=True))


def test_index_add_gradient_exists_only_while_translated():
    fn, shapes = CASES["index_add"]
    args = _inputs(shapes, torch.float32)
    with pytest.raises(RuntimeError, match="Failed to find a gradient transform"):
        _step(thunder.jit(fn), args)
    with library_ops_translated() as translations:
        assert "index_add (its gradient)" in [t.op for t in translations]
        _step(thunder.jit(fn), args)
    with pytest.raises(RuntimeError, match="Failed to find a gradient transform"):
        _step(thunder.jit(fn), args)


def _narrow_after_a_branch(x: torch.Tensor, n: int) -> torch.Tensor:
    if not n:  # under the "symbolic values" cache Thunder holds n fixed from here: its prologue checks the value
        return x
    return x.narrow(1, 1, n).exp()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_takes_an_int_thunder_holds_fixed(dtype):
    """An int input reaches narrow as a proxy under Thunder's "symbolic values" cache; once the program has branched
    on it Thunder holds it fixed, so narrow is translated (a slice) with its value, as the norm is, and another
    value traces again: torch's values and gradients for each value."""
    (x,) = _inputs([(3, 6)], dtype)
    with library_ops_translated():
        jitted = thunder.jit(_narrow_after_a_branch, cache="symbolic values")
        for n in (2, 3, 2):
            got = _step(lambda x: jitted(x, n), [x])  # noqa: B023 (called at once)
            want = _step(lambda x: _narrow_after_a_branch(x, n), [x])  # noqa: B023
            assert torch.equal(got[0], want[0]), n  # a slice: the same bits
            torch.testing.assert_close(got[1], want[1])  # exp's gradient: bf16 rounds it otherwise in Thunder
    [narrow] = [b for b in thunder.last_traces(jitted)[0].bound_symbols if b.sym.id == "thunder_fusion_guard.narrow"]
    ids = [str(s.sym.id) for s in narrow.subsymbols]
    assert "PrimIDs.SLICE" in ids and "torch.narrow" not in ids, ids  # not Thunder's automatic registration
    assert (thunder.cache_misses(jitted), thunder.cache_hits(jitted)) == (2, 1)  # a trace for each value


def _contract_and_norm(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    return torch.tensordot(a, b, dims=([k], [k])).sum(0) + a.norm(dim=k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int_thunder_leaves_symbolic_runs_as_thunder_registered_it(dtype):
    """An int input the program never branched on may change from call to call under the "symbolic values" cache:
    read into tensordot's dims or the norm's dim it would be built into the trace unchecked, so those calls run as
    Thunder registered them, one trace for every value, each value with torch's values and gradients."""
    a, b = _inputs([(3, 3), (3, 3)], dtype)
    with library_ops_translated():
        jitted = thunder.jit(_contract_and_norm, cache="symbolic values")
        for k in (0, 1, 0):
            got = _step(lambda a, b: jitted(a, b, k), [a, b])  # noqa: B023 (called at once)
            want = _step(lambda a, b: _contract_and_norm(a, b, k), [a, b])  # noqa: B023
            for g, w in zip(got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape, k
                torch.testing.assert_close(g, w)
    assert thunder.cache_misses(jitted) == 1


def e3nn_like(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What e3nn's generated tensor-product code does: narrow the input per irrep, contract with tensordot."""
    a, b = x.narrow(-1, 0, 4), x.narrow(-1, 4, 4)
    return torch.tensordot(a * b, w, dims=([1], [0])).sin()


def test_thunderfx_keeps_translated_ops_in_thunder_and_why_names_the_translation():
    torch.manual_seed(0)
    x, w = torch.randn(5, 8, requires_grad=True), torch.randn(4, 3, requires_grad=True)

    def split_off(compiled):
        compiled(x, w)
        return sorted(op.target for op in thunderfx_split_ops(compiled))

    plain = thunderfx(e3nn_like)
    assert split_off(plain) == ["Tensor.narrow", "Tensor.narrow", "torch.functional.tensordot"]
    why = why_not_fused(plain, x, w)
    fixes = {r.op: r.try_ for r in why.rows if r.kind == "outside_thunder"}
    assert any("translate_library_ops()" in fix for fix in fixes.values()), fixes
    with library_ops_translated():
        translated = thunderfx(e3nn_like)
        assert split_off(translated) == []
        out = translated(x, w)
    torch.testing.assert_close(out, e3nn_like(x, w))
    assert split_off(thunderfx(e3nn_like)) == split_off(plain)  # removed: split off again


def test_a_split_note_names_the_translation_that_would_keep_the_op_in_thunder():
    """The report's note on a split at an op Thunder only falls back for says that translate_library_ops() keeps it
    in Thunder where the package translates it (MACE untranslated: 71 Thunder and 70 Inductor parts on CPU), and
    says nothing more for an op without a translation."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 8, requires_grad=True), torch.randn(4, 3, requires_grad=True)

    def scattered(a):
        return torch.zeros(3).scatter_reduce(0, torch.tensor([0, 1, 1, 2, 0]), a.sum(1), reduce="amax").exp()

    compiled = thunderfx(lambda a, b: e3nn_like(a, b).sum() + scattered(a).sum())
    compiled(x, w)
    notes = {note for sub in thunderfx_subgraphs(compiled) for note in sub.split_reasons}
    hint = "Thunder has only an automatic torch fallback for it; translate_library_ops() runs it in Thunder"
    assert f"torch.functional.tensordot: {hint}" in notes, notes
    assert f"Tensor.narrow: {hint}" in notes, notes
    (scatter,) = [n for n in notes if "scatter_reduce" in n]
    assert scatter.endswith("Thunder has only an automatic torch fallback for it"), scatter


def test_translating_twice_changes_nothing_and_untranslating_restores():
    from thunder.torch import _torch_to_thunder_function_map

    before = _torch_to_thunder_function_map[torch.tensordot]
    first = translate_library_ops()
    try:
        symbol = _torch_to_thunder_function_map[torch.tensordot]
        assert translate_library_ops() == first and _torch_to_thunder_function_map[torch.tensordot] is symbol
        assert symbol is not before
    finally:
        untranslate_library_ops()
    assert _torch_to_thunder_function_map[torch.tensordot] is before
    untranslate_library_ops()  # again: nothing to restore


def test_other_norms_run_as_thunder_registered_them():
    """Only the 2-norm of a real floating tensor is translated; another order runs as Thunder registered it."""
    a = torch.randn(3, 4)
    with library_ops_translated():
        jitted = thunder.jit(lambda a: a.norm(p=1, dim=1) + torch.linalg.vector_norm(a, ord=3, dim=1))
        torch.testing.assert_close(jitted(a), a.norm(p=1, dim=1) + torch.linalg.vector_norm(a, ord=3, dim=1))
    ids = {str(b.sym.id) for b in thunder.last_traces(jitted)[0].bound_symbols}
    assert not {i for i in ids if "l2_norm" in i}, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_2_norm_in_another_dtype_runs_as_thunder_registered_it_with_its_gradient(dtype):
    """A norm asked for in another dtype is not translated: Thunder's registration computes it, with torch's values
    and gradients (the call handed to it leaves out the default p, on which Thunder's gradient of it fails)."""
    a, b = _inputs([(4, 3), (4,)], dtype)

    def fn(a, b):
        return a.norm(dim=1, dtype=torch.float64) * b

    with library_ops_translated():
        jitted = thunder.jit(fn)
        got = _step(jitted, [a, b])
    ids = {str(b.sym.id) for b in thunder.last_traces(jitted)[0].bound_symbols}
    assert "thunder_fusion_guard.norm" in ids and not {i for i in ids if "l2_norm" in i}, ids
    for g, w in zip(got, _step(fn, [a, b]), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_e3nn_extract_out_of_place_gives_its_values_and_gradients(dtype):
    """``nn.Gate``'s Extract, written with slices and cat: the same bits as e3nn's in-place copies, and
    Thunder now gives its input a gradient."""
    nn = pytest.importorskip("e3nn.nn")
    extract = nn.Extract(
        "1e + 0e + 0e + 2x1o", ["0e + 1e", "0e", "2x1o", "1e + 0e + 0e + 2x1o"], [(1, 0), (2,), (3,), (0, 1, 2, 3)]
    )
    torch.manual_seed(0)
    x = torch.randn(5, 11, dtype=dtype, requires_grad=True)
    weights = [torch.linspace(-1, 1, n, dtype=dtype) for n in (4, 1, 6, 11)]

    def step(fn):
        outs = fn(x)
        grad = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights, strict=True)), x)[0]
        return [*outs, grad]

    want = step(extract)
    with library_ops_translated():
        jitted = step(thunder.jit(extract))  # first: Thunder's interpreter makes the module's plan
        eager = step(extract)
    assert all(torch.equal(g, w) for g, w in zip(eager, want, strict=True))
    for g, w in zip(jitted, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert step(extract)[0].data_ptr() != x.data_ptr()  # restored: e3nn's own forward again
    with library_ops_translated():  # a module made while translated has its plan from the start
        assert "_tfg_extract_plan" in nn.Extract("0e + 1o", ["1o"], [(1,)]).__dict__
    assert "_tfg_extract_plan" not in nn.Extract("0e + 1o", ["1o"], [(1,)]).__dict__  # e3nn's constructor again


@pytest.mark.parametrize("layers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_e3nn_built_nequip_trains_as_one_thunder_program_when_translated(layers):
    """The zoo's NequIP of e3nn's own modules, with one interaction block (its two blocks with --run-slow, as
    the zoo runs it): unguarded ThunderFX splits off dozens of ops and leaves parameters without gradient;
    translated and guarded, it is one Thunder program and every gradient is eager's."""
    pytest.importorskip("e3nn")
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.bench.zoo_models import e3nn_nequip

    model = e3nn_nequip("cpu", layers=layers)  # before the translation, compiled before any eager call
    params = [p for p in model.module.parameters() if p.requires_grad]
    inputs = model.inputs
    guard = FusionGuard(costs=Costs(measure_budget_s=0))
    with library_ops_translated():
        compiled = thunderfx(model.module, transforms=[guard])
        gots = torch.autograd.grad(model.loss(compiled(*inputs)), [*params, inputs[0]], allow_unused=True)
    wants = torch.autograd.grad(model.loss(model.module(*inputs)), [*params, inputs[0]])
    assert len(compiled._backend.subgraph_infos) == 1  # one Dynamo graph: no break at e3nn's Extract
    assert thunderfx_split_ops(compiled) == []
    assert all(g is not None for g in gots)
    for got, want in zip(gots, wants, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    lost = [d for d in guard.report.decisions if "without_grad" in d.details]  # gradients lost
    unrescued = [d for d in guard.report.decisions if "error_type" in d.details and "rescued_by" not in d.details]
    assert not lost and not unrescued


@pytest.mark.slow
def test_a_second_e3nn_built_model_runs_guarded_as_unguarded_when_translated():
    """The zoo's second configuration of e3nn's modules (spherical harmonics to l = 3, 16 channels, three blocks):
    translated, ThunderFX runs it as one program, guarded and not, with the same bits, every gradient eager's."""
    pytest.importorskip("e3nn")
    from thunder_fusion_guard import FusionGuard
    from thunder_fusion_guard.bench.zoo_models import ZOO

    model = ZOO["e3nn-nequip-modules-l3"].build("cpu")
    inputs = model.inputs
    params = [p for p in model.module.parameters() if p.requires_grad]
    results = []
    with library_ops_translated():
        for transforms in ([], [FusionGuard(costs=Costs(measure_budget_s=0))]):
            compiled = thunderfx(model.module, transforms=transforms)
            results.append(torch.autograd.grad(model.loss(compiled(*inputs)), [*params, inputs[0]]))
            assert len(compiled._backend.subgraph_infos) == 1 and thunderfx_split_ops(compiled) == []
    wants = torch.autograd.grad(model.loss(model.module(*inputs)), [*params, inputs[0]])
    unguarded, guarded = results
    assert all(torch.equal(g, u) for g, u in zip(guarded, unguarded, strict=True))
    for got, want in zip(guarded, wants, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
