#!/usr/bin/env bash
# Decision accuracy on a GPU with nothing cached (issue 10), < 8 minutes on an H100.
#   source .gpu/setup.sh && bash benchmarks/gpu_decisions.sh
# 1. An empty cache: the first guarded thunder.jit calibrates by itself; prints how long it took, the
#    constants and how each region was decided. 2. `fusion-guard bench decisions` over the corpus
#    (lone ops and chains 4 KiB-32 MiB, nanoGPT block, litgpt 1-layer training steps, OpInfo sample),
#    confusion table last. Files in $OUT: decisions-first-jit.txt, decisions-cuda.json, decisions-cuda.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/tfg-gpu-decisions}"
mkdir -p "$OUT"
TFG_CACHE_DIR="$(mktemp -d)"
export TFG_CACHE_DIR
python3 benchmarks/gpu_first_jit.py 2>&1 | tee "$OUT/decisions-first-jit.txt"
python3 -m thunder_fusion_guard bench decisions --device cuda --time-limit 300 --region-s 0.3 --rows \
  --json "$OUT/decisions-cuda.json" > "$OUT/decisions-cuda.txt"
sed -n '/^decision accuracy/,$p' "$OUT/decisions-cuda.txt"
