#!/usr/bin/env bash
# The OpInfo cases that once flaked on an H100 (take_along_axis, gather: a scatter-add backward with
# atomics), RUNS times each through the harness the CUDA suite uses, with pass counts; and how noisy
# unguarded Thunder is there with and without torch's deterministic algorithms (the harness uses them).
#
#   source .gpu/setup.sh && bash benchmarks/gpu_flaky.sh        # RUNS=20 by default, < 8 min
#
# Stops starting new checks after TFG_GPU_BUDGET_S seconds (default 420) and says how many it ran.
# OPS="take_along_axis" checks only the ops named (default: take_along_axis gather).
# TFG_FLAKY_CPU=1 runs the same on CPU (torch.compile executor), to try the script without a GPU.
# Writes $OUT/flaky.json and $OUT/flaky.txt; the table comes last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 - "${RUNS:-20}" "${TFG_GPU_BUDGET_S:-420}" "$OUT" ${OPS:-take_along_axis gather} <<'EOF' 2>&1 | grep -v -i "warn" | tee "$OUT/flaky.txt"
import json
import os
import sys
import time

sys.path.insert(0, "tests")
import torch
from opinfo_harness import CPU, CUDA, Case, _distinct, check_op, corpus, op_key, pick_dtype

runs, budget, out, names = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
began = time.perf_counter()
backend = CPU if os.environ.get("TFG_FLAKY_CPU") else CUDA
device = torch.cuda.get_device_name() if backend is CUDA else "cpu"
ops = {op_key(op): op for op in corpus(backend)}
print(f"device: {device} ({backend.name}), torch {torch.__version__}, {runs} runs per op")
results = {}
for name in names:
    op = ops[name]
    case = Case(op, backend, pick_dtype(op), grad=True)
    noise = {}
    for deterministic in (False, True):  # unguarded Thunder's own run-to-run noise, 10 runs
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        try:
            noise["deterministic" if deterministic else "default"] = _distinct([case._run(None) for _ in range(10)])
        finally:
            torch.use_deterministic_algorithms(False)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "noise_notes": 0}
    reasons = []
    for i in range(runs):
        if time.perf_counter() - began > budget:
            break
        outcome = check_op(op, backend)
        counts[outcome.status] += 1
        counts["noise_notes"] += sum("not reproducible" in n for n in outcome.notes)
        if outcome.status != "passed":
            reasons.append(outcome.reason)
    results[name] = {"runs": sum(counts[k] for k in ("passed", "failed", "skipped")), **counts,
                     "distinct_unguarded_results_in_10": noise, "reasons": reasons}
    print(name, json.dumps(results[name]), flush=True)
with open(f"{out}/flaky.json", "w") as f:
    json.dump({"device": device, "backend": backend.name, "torch": torch.__version__, "results": results}, f, indent=1)
print(f"\n{'op':<16} {'runs':>4} {'passed':>6} {'failed':>6} {'skipped':>7} {'noise notes':>11}  distinct unguarded (default / deterministic)")
for name, r in results.items():
    noise = r["distinct_unguarded_results_in_10"]
    print(f"{name:<16} {r['runs']:>4} {r['passed']:>6} {r['failed']:>6} {r['skipped']:>7} {r['noise_notes']:>11}  "
          f"{noise['default']} / {noise['deterministic']}")
print(f"({time.perf_counter() - began:.0f} s)")
EOF
