#!/usr/bin/env bash
# HTML reports with pictures on a CUDA machine: `fusion-guard report --html` of a nanoGPT block, litgpt
# Llama-2 (one layer, real width, 512 tokens, bf16) and the ThunderFX example, each region profiled (device
# µs, GB/s and % of the device's peak memory bandwidth, kernels), the dataflow of every trace before and
# after the guard, kernels per call measured.
#
#   source .gpu/setup.sh && bash benchmarks/gpu_pictures.sh      (about 3-5 minutes)
#
# Writes 8 files into $OUT (default benchmarks/results/gpu): <dev>-report-<target>.html and .txt (the
# printed decision table and profile) for nanogpt, llama2 and thunderfx, the nanoGPT block's DOT, and
# run.log; <dev> is h100, h200 or gpu. Prints the profiles' GB/s rows last. Screenshots: run
# `bash benchmarks/screenshot.sh FILE.html FILE.png` where Chromium is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
DEV=$("$PY" -c "import torch; n = torch.cuda.get_device_name(); print(next((d.lower() for d in ('H200', 'H100') if d in n), 'gpu'))")
exec > >(tee "$OUT/run.log") 2>&1

report() {  # report NAME MAX_SECONDS TARGET [OPTIONS...]
  local name=$1 max=$2 target=$3 began=$SECONDS
  shift 3
  timeout "$max" "$PY" -m thunder_fusion_guard report "$target" --device cuda --html "$OUT/$DEV-report-$name.html" "$@" \
    > "$OUT/$DEV-report-$name.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - began)) s"
}

report nanogpt 150 benchmarks/picture_targets.py:nanogpt_block --dot "$OUT/$DEV-report-nanogpt.dot"
report llama2 270 benchmarks/picture_targets.py:llama2_layer
report thunderfx 120 examples/report_target.py:make --thunderfx

for name in nanogpt llama2 thunderfx; do
  echo "===== $name: profile ====="
  sed -n '/^profile of/,$p' "$OUT/$DEV-report-$name.txt" | grep -v -i warn | cut -c1-220
done
