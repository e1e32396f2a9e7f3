"""FusionGuard against unguarded Thunder over Thunder's OpInfo corpus (harness: opinfo_harness.py).

CI runs a fixed subset on CPU (first float32 sample of each op) in the guard variants that rewrite
most (``CI_VARIANTS``: the defaults, every region sent to torch, the cost model rejecting every exact
region); ``--run-slow`` runs that subset in every variant and the rest of the corpus; the CUDA test runs
the whole corpus through nvFuser with shape-only fusions enabled, every variant. Outside CI,
``TFG_OPINFO_SAMPLES=N`` compares the first N samples of each op in the slow and CUDA tests.
"""

import os

import pytest
from opinfo_harness import CPU, CUDA, check_op, ci_subset, corpus, op_key

CI = ci_subset(CPU)
REST = [op for op in corpus(CPU) if op not in CI]
SAMPLES = int(os.environ.get("TFG_OPINFO_SAMPLES", "1"))
CI_VARIANTS = ("default", "metadata_ops", "eager_cheap")


def _check(op, backend, samples=1, only=None):
    outcome = check_op(op, backend, samples=samples, only=only)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status == "passed", "\n".join(outcome.notes)


@pytest.mark.parametrize("op", CI, ids=op_key)
def test_guard_matches_unguarded(op):
    _check(op, CPU, only=CI_VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize("op", CI, ids=op_key)
def test_guard_matches_unguarded_every_variant(op):
    _check(op, CPU)


@pytest.mark.slow
@pytest.mark.parametrize("op", REST, ids=op_key)
def test_guard_matches_unguarded_full_corpus(op):
    _check(op, CPU, SAMPLES)


@pytest.mark.cuda
@pytest.mark.parametrize("op", corpus(CUDA), ids=op_key)
def test_guard_matches_unguarded_nvfuser(op):
    _check(op, CUDA, SAMPLES)
