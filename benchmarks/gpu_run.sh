#!/usr/bin/env bash
# The GPU measurements for benchmarks/RESULTS.md on a CUDA machine (made for an H100), within a time budget.
#
#   source .gpu/setup.sh && bash benchmarks/gpu_run.sh [STAGE...]
#
# Stages, in this order by default: micro (lone ops, small and large), profile (profile_regions of a
# nanoGPT block), mistral, llama2, phi2 (litgpt at 2 layers, batch 1, 512 tokens, bf16, one
# forward+backward step: eager vs thunder vs guarded). The whole run stays under TFG_GPU_BUDGET_S
# seconds (default 460, < 8 min): a stage gets what is left, a stage that cut short keeps the cases it
# finished, and stages that no longer fit are skipped and named at the end, to run in a second call.
# Thunder's first call of a 2-layer litgpt model compiles for minutes (140 s for Mistral on an H200),
# so the default run usually reaches one or two models.
#
# Writes into $OUT (default benchmarks/results/gpu): gpu-<stage>.json (pytest-benchmark JSON, or the
# profile's JSON), gpu-profile.png, summary.md (markdown tables) and run.log.
# TFG_BENCH_VARIANTS=thunder,guarded,eager,inductor,inductor-ro adds torch.compile to the bench stages.
# The litgpt comparison with CUDA graphs and torch.compile (training and decode steps) is
# benchmarks/gpu_models.py; CONTRIBUTING.md gives its commands.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY="${PYTHON:-python3}"
DEADLINE=$((SECONDS + ${TFG_GPU_BUDGET_S:-460}))
PARTS=$(mktemp -d)
SKIPPED=()
VARIANTS=(${TFG_BENCH_VARIANTS:+--variants "$TFG_BENCH_VARIANTS"})
exec > >(tee "$OUT/run.log") 2>&1

stage() {  # stage NAME MAX_SECONDS COMMAND... : run COMMAND with what is left of the budget
  local name=$1 max=$2 left=$((DEADLINE - SECONDS - 15)) began=$SECONDS
  shift 2
  if ((left < 45)); then
    echo "== $name: skipped, the time budget is spent"
    SKIPPED+=("$name")
    return
  fi
  echo "== $name (limit $((max < left ? max : left)) s)"
  timeout "$((max < left ? max : left))" "$@"
  echo "== $name: exit $? after $((SECONDS - began)) s"
}

bench() {  # bench NAME MAX_SECONDS TITLE ARGS... : one `bench run` stage, its table into the summary
  local name=$1 max=$2 title=$3
  shift 3
  stage "$name" "$max" "$PY" -m thunder_fusion_guard bench run --device cuda "${VARIANTS[@]}" "$@" \
    --json "$OUT/gpu-$name.json" --markdown "$PARTS/$name.md"
  [ -f "$PARTS/$name.md" ] && printf '## %s\n\n%s\n\n' "$title" "$(cat "$PARTS/$name.md")" >> "$PARTS/summary.md"
}

"$PY" -c "import torch, thunder; print('device:', torch.cuda.get_device_name(), '| torch', torch.__version__, '| thunder', thunder.__version__)"

STAGES=("$@")
((${#STAGES[@]})) || STAGES=(micro profile mistral llama2 phi2)
for name in "${STAGES[@]}"; do
  case $name in
    micro)
      bench micro 150 "micro: lone ops, nvFuser with shape-only regions allowed (median µs per call)" \
        --suite micro --reps 30 ;;
    mistral | llama2 | phi2)
      bench "$name" 400 "litgpt $name, 2 layers, batch 1, 512 tokens, bf16, forward+backward (median µs per step)" \
        --suite models --case "litgpt-$name-fwdbwd" --heavy --reps 10 --warmup 2 ;;
    decode)
      bench decode 200 "litgpt Llama-2-7b-hf decode step, 2 layers, KV cache of 512, one token, bf16 (median µs per step)" \
        --suite models --case litgpt-llama2-decode --heavy --reps 30 --warmup 3 ;;
    profile)
      stage profile 120 "$PY" - "$OUT" "$PARTS" <<'EOF'
import sys
from pathlib import Path

import thunder

from thunder_fusion_guard import FusionGuard, profile_regions
from thunder_fusion_guard.bench.cases import case_named

out, parts = Path(sys.argv[1]), Path(sys.argv[2])
workload = case_named("nanogpt-block-fwdbwd").build("cuda")
jitted = thunder.jit(workload.fn, transforms=[FusionGuard()])
profile = profile_regions(jitted, *workload.args, reps=50)
print(profile)
(out / "gpu-profile.json").write_text(profile.to_json(indent=1))
with open(parts / "summary.md", "a") as f:
    f.write(f"## profile_regions: nanoGPT block (batch 4, 512 tokens, n_embd 768, bf16)\n\n```\n{profile}\n```\n\n")
try:
    profile.plot(out / "gpu-profile.png")
except ImportError as e:
    print(f"no plot: {e}")
EOF
      ;;
    *) echo "unknown stage '$name' (stages: micro profile mistral llama2 phi2 decode)" ;;
  esac
done

cp "$PARTS/summary.md" "$OUT/summary.md" 2>/dev/null && echo "wrote $OUT/summary.md"
rm -rf "$PARTS"
if ((${#SKIPPED[@]})); then
  echo "not run (out of time): ${SKIPPED[*]}; run them in another call: bash benchmarks/gpu_run.sh ${SKIPPED[*]}"
fi
