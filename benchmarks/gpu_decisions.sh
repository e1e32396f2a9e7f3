#!/usr/bin/env bash
# Decision accuracy on a GPU with nothing cached (issue 10), < 8 minutes on an H100.
#   source .gpu/setup.sh && bash benchmarks/gpu_decisions.sh
# 1. An empty cache: the first guarded thunder.jit calibrates by itself; prints how long it took, the
#    constants and how each region was decided. 2. `fusion-guard bench decisions` over the corpus
#    (lone ops and chains 4 KiB-32 MiB, nanoGPT block, litgpt 1-layer training steps, OpInfo sample);
#    it starts no program after 240 s and is stopped at 360 s, keeping what it measured (the JSON is
#    rewritten after every program). The confusion table is printed last.
# Files in $OUT: decisions-first-jit.txt, decisions-cuda.json, decisions-cuda.txt (one line per region).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tfg-gpu-decisions}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
TFG_CACHE_DIR="$(mktemp -d)"
export TFG_CACHE_DIR
timeout 90 python3 benchmarks/gpu_first_jit.py 2>&1 | tee "$OUT/decisions-first-jit.txt"
timeout 360 python3 -m thunder_fusion_guard bench decisions --device cuda --time-limit 240 --region-s 0.3 --rows \
  --json "$OUT/decisions-cuda.json" > "$OUT/decisions-cuda.txt"
echo "bench decisions exit status: $?"
python3 - "$OUT/decisions-cuda.json" <<'PY'
import json, sys
from thunder_fusion_guard.bench.decisions import format_summary
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['programs'])} programs in {doc['seconds']} s; not run: {doc['skipped'] or 'none'}")
print(format_summary(doc["summary"], doc["machine_info"].get("device_name", "cuda")))
PY
