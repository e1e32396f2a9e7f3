"""FusionGuard against unguarded Thunder over Thunder's OpInfo corpus (harness: opinfo_harness.py).

CI runs a fixed subset on CPU (first sample of each op in its preferred dtype, float32 mostly) in the
guard variants that rewrite most (``CI_VARIANTS``: the defaults, every region sent to torch, the cost
model rejecting every exact region): every metadata and shape op of it and one or two compute ops of each
kind (the others of the subset, ``CI_SLOW``, run with ``--run-slow``), and the element-wise part of it in
bfloat16 (float16 too with ``--run-slow``), where fusions and op-by-op runs round differently;
``--run-slow`` also runs the subset in every variant and the rest of the corpus; the CUDA test runs the
whole corpus through nvFuser with shape-only fusions enabled, every variant. The slow and CUDA tests run
each dtype named in ``TFG_OPINFO_DTYPES`` (default ``float32,bfloat16,float16``; ``preferred`` is the
op's own pick). Outside CI,
``TFG_OPINFO_SAMPLES=N`` compares the first N samples of each op in the slow and CUDA tests.
"""

import os

import pytest
from opinfo_harness import CPU, CUDA, check_op, ci_subset, corpus, dtype_named, op_key

CI = ci_subset(CPU)
# Compute ops of the CI subset whose kind another op of the default run covers: slow, in CI_VARIANTS.
CI_SLOW = {
    "gelu",  # as add and where: element-wise
    "tril",  # as where: a mask
    "pad",  # as torch_pad
    "eq",  # as where: a comparison
    "bitwise_and",
    "var_mean",  # as sum and softmax: reductions
    "argmax",
    "cross_entropy",  # as layer_norm and softmax
    "scatter_add",  # as gather and index_put: indexing
    "embedding",
    "take_along_axis",
    "topk",
    "repeat_interleave",
}
assert {op_key(op) for op in CI} >= CI_SLOW, CI_SLOW - {op_key(op) for op in CI}
REST = [op for op in corpus(CPU) if op not in CI]
SAMPLES = int(os.environ.get("TFG_OPINFO_SAMPLES", "1"))
DTYPES = [d.strip() for d in os.environ.get("TFG_OPINFO_DTYPES", "float32,bfloat16,float16").split(",") if d.strip()]
CI_VARIANTS = ("default", "metadata_ops", "eager_cheap")
# Element-wise ops of the CI subset, the ones a bf16/fp16 chain is built from.
LOW_PRECISION_CI = [
    op
    for op in CI
    if op_key(op) in {"add", "mul", "sub", "neg", "abs", "where", "maximum", "clamp", "true_divide", "to", "relu"}
]


def _check(op, backend, samples=1, dtype=None, only=None):
    wanted = None if dtype in (None, "preferred") else dtype_named(dtype)
    outcome = check_op(op, backend, samples=samples, dtype=wanted, only=only)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status == "passed", "\n".join(outcome.notes)


def _slow_unless(default: bool, op):
    return op if default else pytest.param(op, marks=pytest.mark.slow)


@pytest.mark.parametrize("op", [_slow_unless(op_key(op) not in CI_SLOW, op) for op in CI], ids=op_key)
def test_guard_matches_unguarded(op):
    _check(op, CPU, only=CI_VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize("op", CI, ids=op_key)
def test_guard_matches_unguarded_every_variant(op):
    _check(op, CPU)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("op", LOW_PRECISION_CI, ids=op_key)
def test_guard_matches_unguarded_low_precision(op, dtype):
    _check(op, CPU, dtype=dtype, only=CI_VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REST, ids=op_key)
def test_guard_matches_unguarded_full_corpus(op, dtype):
    _check(op, CPU, SAMPLES, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", corpus(CUDA), ids=op_key)
def test_guard_matches_unguarded_nvfuser(op, dtype):
    _check(op, CUDA, SAMPLES, dtype)
