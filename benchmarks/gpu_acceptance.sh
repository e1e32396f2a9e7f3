#!/usr/bin/env bash
# The GPU acceptance run of a commit (issue 20, item 5): < 9 minutes on one H100, setup included.
#
#   source .gpu/setup.sh && TFG_COMMIT=<full sha of the checkout> bash benchmarks/gpu_acceptance.sh
#
# The device gets the working tree without .git: take the sha on the machine that has the checkout
# (git rev-parse HEAD, with a clean tree) and write it into the command. litgpt Mistral-7B-v0.1 (2 layers,
# built with litgpt's defaults, bf16, batch 1, 512 tokens, forward+backward): eager, guarded hoist=False,
# guarded, guarded + CUDA graphs, timed interleaved in one process, bitwise checks against hoist=False;
# the first guarded jit with an empty cache (self-calibration); pytest -m cuda of the nvFuser rejection,
# compile options, rounding and hoisting tests. See benchmarks/gpu_acceptance.py for the details.
# Writes $OUT/acceptance-<gpu>-<short sha>.json (copy it into benchmarks/results/ and commit it), .md,
# acceptance-pytest.txt and acceptance-first-jit.txt; the summary is printed last. Arguments go to the
# Python script (--budget-s S, default 480 from its start; --rounds N; --no-pytest; --smoke on CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
echo "[acceptance] $(date -u +%H:%M:%S) start; commit ${TFG_COMMIT:-not given}; $(nproc) cores"
exec python3 benchmarks/gpu_acceptance.py "$@"
