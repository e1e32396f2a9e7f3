#!/usr/bin/env bash
# The runs on a CUDA machine, one subcommand each, from any folder (it works from the repository root):
#
#   source .gpu/setup.sh && bash benchmarks/gpu.sh SUBCOMMAND [ARGS...]
#   bash benchmarks/gpu.sh --help                       # the subcommands
#
# Files go to $OUT (each subcommand names its default). `gpu.sh --help` describes every subcommand.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu.sh SUBCOMMAND [ARGS...]    (files go to $OUT)

  acceptance [ARGS]    the acceptance run of a commit, 5-8 min on one H100: litgpt Mistral-7B-v0.1 (2 layers,
                       bf16, 512 tokens, forward+backward) as eager, guarded hoist=False, guarded and guarded +
                       CUDA graphs, timed interleaved, bitwise checks, the first guarded jit with an empty cache,
                       pytest -m cuda; TFG_COMMIT=<full sha> names the commit. ARGS go to gpu_acceptance.py
                       (--budget-s S, --rounds N, --no-pytest, --smoke). Writes acceptance-<gpu>-<sha>.json, .md
  check                the nvFuser segment/rewrite tests on CUDA, report --thunderfx and report on CUDA,
                       Llama-2 bitwise equality (gpu_models.py) and the OpInfo corpus on nvFuser
  correctness          nvFuser property tests in bf16/fp16/fp32, the guard's CUDA tests, the OpInfo corpus on
                       nvFuser in bf16 and fp16, and this GPU's cost constants; < 10 min
  decisions            an empty cache: the first guarded jit calibrates by itself; then `fusion-guard bench
                       decisions` over the corpus (no program started after 240 s, stopped at 360 s); < 8 min
  distributed [ARGS]   benchmarks/gpu_distributed.py under torchrun on NPROC GPUs (default 2)
  distributed-matrix   every set-up of gpu_distributed.py on NPROC GPUs (default 2), each a job side by side:
                       litgpt Mistral-7B-v0.1 (2 layers) under Thunder's FSDP, Thunder's DDP, ThunderFX + DDP
                       and ThunderFX + FSDP2, and e3nn-nequip-modules under ThunderFX + DDP, as eager, thunder,
                       guarded and guarded + CUDA graphs (ThunderFX + DDP also thunder + CUDA graphs and guarded +
                       GuardedCUDAGraphs(share_buffers=False), and in a process of its own guarded compiled before
                       thunder: does the order change the bits?); each job cut at 570 s; TFG_COMMIT=<full sha>
                       names the commit. Writes
                       distributed-<gpu>x<NPROC>-<sha>.json, .md and each job's log
  flaky                the OpInfo cases that once flaked on an H100 (OPS, default take_along_axis gather), RUNS
                       times each (default 20), and unguarded Thunder's run-to-run noise; TFG_FLAKY_CPU=1 on CPU
  hf [ARGS]            benchmarks/gpu_hf.py (Hugging Face models)
  hoist [ARGS]         benchmarks/gpu_hoist.py (hoisting on and off)
  install-check        the README snippets and the CLI on CUDA, and an nvFuser that fails to load named as such
  models [ARGS]        benchmarks/gpu_models.py (litgpt models: eager, Thunder, guarded, CUDA graphs,
                       torch.compile, interleaved)
  pictures             HTML reports with pictures (nanoGPT block, litgpt Llama-2 layer, ThunderFX example)
  run [STAGE...]       the GPU measurements of benchmarks/RESULTS.md within TFG_GPU_BUDGET_S (default 460 s);
                       stages micro profile mistral llama2 phi2 (default) and decode
  why                  why ops sit outside fusions in litgpt Llama-2's training step (fusion-guard why, with
                       nvFuser's segments), and the CUDA tests of why_not_fused; writes why-llama2.json, .txt
  zoo [ARGS]           fusion-guard bench zoo --device cuda (third-party models, every compiler path); ARGS go
                       to it (default: --jobs 4 --time-limit 420); writes zoo-cuda.json, .md
  zoo-kernels [ARGS]   benchmarks/zoo_kernels.py: kernels, device and wall ms per step of one zoo model per path
                       (default: the rewritten NequIP-style model; inductor, inductor-ro, guarded, + CUDA graphs)
  wheels download|install WHEELS
                       fetch the GPU dependencies as wheels (on a machine with network), or install them from
                       that folder with no network (pip --no-index)
EOF
}

cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# The runs compare with unguarded Thunder, whose nvFuser regions need enable_nvfuser_direct() on nvfuser_direct-only
# builds: every process they start opts in (TFG_NVFUSER_DIRECT=1), but the acceptance's, whose paths are all guarded
export TFG_NVFUSER_DIRECT=${TFG_NVFUSER_DIRECT:-1}

acceptance() {
  unset TFG_NVFUSER_DIRECT  # its guarded regions run on the package's scoped nvFuser fix alone
  # Writes $OUT/acceptance-<gpu>-<short sha>.json (copy it into benchmarks/results/ and commit it), .md,
  # acceptance-pytest.txt and acceptance-first-jit.txt; the summary is printed last. The working tree may come
  # without .git: take the sha where the checkout is (git rev-parse HEAD, with a clean tree) into TFG_COMMIT.
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "[acceptance] $(date -u +%H:%M:%S) start; commit ${TFG_COMMIT:-not given}; $(nproc) cores"
  exec python3 benchmarks/gpu_acceptance.py "$@"
}

check() {
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
  set -x
  python3 -m pytest -q -s -p no:logging -m cuda tests/test_nvfuser_segments.py tests/test_nvfuser.py tests/test_inplace.py \
    tests/test_rewrites.py 2>&1 | grep -v -i warn > "$OUT/segments_tests.txt"; tail -5 "$OUT/segments_tests.txt"
  python3 -m thunder_fusion_guard report examples/report_target.py:make --thunderfx --device cuda \
    --json "$OUT/report_fx.json" --markdown "$OUT/report_fx.md" > "$OUT/report_fx.txt" 2>&1; tail -3 "$OUT/report_fx.txt"
  python3 -m thunder_fusion_guard report examples/report_target.py:make --device cuda --markdown "$OUT/report_jit.md" \
    > "$OUT/report_jit.txt" 2>&1; tail -3 "$OUT/report_jit.txt"
  python3 benchmarks/gpu_models.py --model Llama-2-7b-hf --variants eager,thunder,guarded --rounds 10 \
    --out /tmp/tfg-gpu-models --json "$OUT/llama2-equality.json" 2>&1 | grep -v -i warn | tail -2
  TFG_COVERAGE_JSON="$OUT/cov_cuda.json" timeout -s INT $((590 - SECONDS - 20)) python3 -m pytest -q -p no:logging \
    -m cuda tests/test_opinfo_diff.py 2>&1 | grep -v -i warn | tail -40 > "$OUT/opinfo_cuda.txt"; tail -12 "$OUT/opinfo_cuda.txt"
}

correctness() {
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
  set -x
  export TFG_ROUNDING_EXAMPLES=${TFG_ROUNDING_EXAMPLES:-60}
  python3 -m pytest -q -p no:logging -m cuda --hypothesis-show-statistics tests/test_rounding.py \
    tests/test_compile_options.py tests/test_nvfuser.py tests/test_inplace.py tests/test_rewrites.py 2>&1 \
    | grep -v -i warn > "$OUT/cuda_tests.txt"; tail -25 "$OUT/cuda_tests.txt"
  python3 -m thunder_fusion_guard calibrate --device cuda > "$OUT/calibration.txt" 2>&1; tail -15 "$OUT/calibration.txt"
  TFG_OPINFO_DTYPES=${TFG_OPINFO_DTYPES:-bfloat16,float16} TFG_COVERAGE_JSON="$OUT/opinfo_cuda_lowp.json" \
    timeout -s INT $((570 - SECONDS)) python3 -m pytest -q -p no:logging -m cuda tests/test_opinfo_diff.py 2>&1 \
    | grep -v -i warn | tail -40 > "$OUT/opinfo_cuda_lowp.txt"; tail -14 "$OUT/opinfo_cuda_lowp.txt"
}

decisions() {
  # 1. An empty cache: the first guarded thunder.jit calibrates by itself; prints how long it took, the
  #    constants and how each region was decided. 2. `fusion-guard bench decisions` over the corpus (lone ops
  #    and chains 4 KiB-32 MiB, nanoGPT block, litgpt 1-layer training steps, OpInfo sample); it starts no
  #    program after 240 s and is stopped at 360 s, keeping what it measured (the JSON is rewritten after every
  #    program). The confusion table is printed last.
  # Files in $OUT: decisions-first-jit.txt, decisions-cuda.json, decisions-cuda.txt (one line per region).
  OUT="${OUT:-/tmp/tfg-gpu-decisions}"
  mkdir -p "$OUT"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
}

flaky() {
  # Stops starting new checks after TFG_GPU_BUDGET_S seconds (default 420) and says how many it ran; < 8 min.
  # Writes $OUT/flaky.json and $OUT/flaky.txt; the table comes last.
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
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
}

install_check() {
  # < 4 min. The nvFuser of .gpu/setup.sh is the build for torch 2.10, loaded next to torch 2.11 only through
  # lazy symbol binding (its sitecustomize.py); without that it fails to load, as it would after
  # 'pip install .' next to torch 2.11. Writes $OUT/install_check.txt; the summary comes last.
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
  LOG="$OUT/install_check.txt"
  : > "$LOG"
  RESULTS=()
  expect() {  # expect NAME EXPECTED_STATUS COMMAND...: run, log, record pass/fail by exit status
    local name=$1 want=$2
    shift 2
    echo "== $name: $*" >> "$LOG"
    "$@" >> "$LOG" 2>&1
    local got=$?
    RESULTS+=("$name: exit $got (want $want) $([ "$got" = "$want" ] && echo ok || echo FAILED)")
  }
  expect "version" 0 python3 -m thunder_fusion_guard --version
  expect "readme-snippets-cuda" 0 python3 -m pytest -q -p no:logging -m cuda tests/test_readme.py
  expect "executors-and-cli-tests" 0 python3 -m pytest -q -p no:logging tests/test_executors.py tests/test_cli.py
  expect "demo-cuda" 0 python3 -m thunder_fusion_guard demo --device cuda --reps 50
  # The same packages without lazy symbol binding: the torch 2.10 nvFuser build next to torch 2.11.
  local strict entry
  strict=$(mktemp -d)
  for entry in /tmp/site/* /tmp/site/.[!.]*; do
    [ -e "$entry" ] && [ "$(basename "$entry")" != sitecustomize.py ] && ln -s "$entry" "$strict/"
  done
  local strict_path="$strict:$PWD"
  expect "strict-nvfuser-problem" 0 env PYTHONPATH="$strict_path" python3 -c "
from thunder_fusion_guard import FusionGuard, fusion_executors, nvfuser_problem
problem = nvfuser_problem()
print('nvfuser_problem():', problem)
assert problem and 'fails to load' in problem, problem
print('fusion_executors(cuda):', [e.name for e in fusion_executors('cuda')])
try:
    FusionGuard(executors=['nvfuser'])
except ValueError as e:
    print('ValueError:', e)
    assert 'nvfuser is not available here' in str(e)
else:
    raise SystemExit('FusionGuard(executors=[nvfuser]) did not raise')
"
  expect "strict-calibrate-nvfuser" 2 env PYTHONPATH="$strict_path" python3 -m thunder_fusion_guard calibrate \
    --executor nvfuser --no-save
  expect "strict-readme-snippets" 0 env PYTHONPATH="$strict_path" python3 -m pytest -q -p no:logging tests/test_readme.py
  rm -rf "$strict"
  grep -v -i "warn" "$LOG" | tail -60
  echo
  echo "summary:"
  printf '  %s\n' "${RESULTS[@]}"
}

pictures() {
  # About 3-5 minutes. `fusion-guard report --html` of a nanoGPT block, litgpt Llama-2 (one layer, real width,
  # 512 tokens, bf16) and the ThunderFX example, each region profiled (device µs, GB/s and % of the device's peak
  # memory bandwidth, kernels), the dataflow of every trace before and after the guard, kernels per call measured.
  # Writes 8 files into $OUT (default benchmarks/results/gpu): <dev>-report-<target>.html and .txt (the printed
  # decision table and profile) for nanogpt, llama2 and thunderfx, the nanoGPT block's DOT, and run.log; <dev> is
  # h100, h200 or gpu. Prints the profiles' GB/s rows last. Screenshots: `bash benchmarks/screenshot.sh FILE.html
  # FILE.png` where Chromium is installed.
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
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
}

run() {
  # Stages, in this order by default: micro (lone ops, small and large), profile (profile_regions of a nanoGPT
  # block), mistral, llama2, phi2 (litgpt at 2 layers, batch 1, 512 tokens, bf16, one forward+backward step: eager
  # vs thunder vs guarded). The whole run stays under TFG_GPU_BUDGET_S seconds (default 460, < 8 min): a stage gets
  # what is left, a stage that is cut short keeps the cases it finished, and stages that no longer fit are skipped
  # and named at the end, to run in a second call. Thunder's first call of a 2-layer litgpt model compiles for
  # minutes (140 s for Mistral on an H200), so the default run usually reaches one or two models.
  # Writes into $OUT (default benchmarks/results/gpu): gpu-<stage>.json (pytest-benchmark JSON, or the profile's
  # JSON), gpu-profile.png, summary.md (markdown tables) and run.log.
  # TFG_BENCH_VARIANTS=thunder,guarded,eager,inductor,inductor-ro adds torch.compile to the bench stages. The
  # litgpt comparison with CUDA graphs and torch.compile (training and decode steps) is `gpu.sh models`.
  OUT="${OUT:-benchmarks/results/gpu}"
  mkdir -p "$OUT"
  export MPLBACKEND=Agg
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
  local stages=("$@") name
  ((${#stages[@]})) || stages=(micro profile mistral llama2 phi2)
  for name in "${stages[@]}"; do
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
    echo "not run (out of time): ${SKIPPED[*]}; run them in another call: bash benchmarks/gpu.sh run ${SKIPPED[*]}"
  fi
}

distributed_matrix() {
  # Six jobs share the GPUs (compare variants within a job: each times alone, TFG_ZOO_LOCK), then one merged file.
  local nproc=${NPROC:-2} port=29510 pids=() spec
  export TFG_ZOO_LOCK=${TFG_ZOO_LOCK:-/tmp/tfg-distributed.lock}
  local jobs=(
    "mistral fsdp eager thunder guarded guarded+cg"
    "mistral ddp eager thunder guarded guarded+cg"
    "mistral fx-ddp eager thunder guarded guarded+cg guarded+cgcopy guarded+cgkeep thunder+cg"
    "mistral fx-fsdp2 eager thunder guarded guarded+cg"
    "e3nn fx-ddp eager thunder guarded guarded+cg"
    "mistral fx-ddp guarded thunder"
  )
  for spec in "${jobs[@]}"; do
    read -r model setup variants <<<"$spec"
    port=$((port + 1))
    # shellcheck disable=SC2086
    timeout 570 torchrun --nproc-per-node "$nproc" --master-port "$port" benchmarks/gpu_distributed.py \
      --models "$model" --setups "$setup" --variants $variants --layers 2 --rounds 5 --budget-s 530 \
      --out "$OUT/jobs" >"$OUT/distributed-$((port - 29510))-$model-$setup.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  python3 benchmarks/gpu_distributed.py --merge "$OUT"/jobs/gpu-distributed-*.json --out "$OUT"
  # names with '+' are not copied back from some machines: the jobs' own files as 'p'
  for f in "$OUT"/jobs/*+*; do [ -e "$f" ] && mv "$f" "${f//+/p}"; done
}

wheels() {
  # On a machine with network, the same OS, CPU architecture and Python version as the GPU machine:
  #   gpu.sh wheels download WHEELS      torch 2.10 + nvFuser for it, Thunder, the test extras
  # copy WHEELS and the repository over, then on the GPU machine, in a fresh venv:
  #   gpu.sh wheels install WHEELS       pip install --no-index from WHEELS only
  set -e
  local what=${1:-} folder=${2:-}
  if [ -z "$what" ] || [ -z "$folder" ]; then
    echo "usage: bash benchmarks/gpu.sh wheels download|install WHEELS_FOLDER" >&2
    exit 2
  fi
  case "$what" in
    download) mkdir -p "$folder" && python3 -m pip download -d "$folder" "$PWD[nvfuser,test,models]" ;;
    install) python3 -m pip install --no-index --find-links "$folder" -e "$PWD[nvfuser,test,models]" ;;
    *) echo "gpu.sh wheels: unknown command '$what' (download or install)" >&2; exit 2 ;;
  esac
}

why() {
  python3 -m pytest -q -m cuda tests/test_why.py -p no:randomly 2>&1 | tail -5
  python3 -m thunder_fusion_guard why benchmarks/why_targets.py:llama2 --device cuda \
    --json "$OUT/why-llama2.json" --traceback | tee "$OUT/why-llama2.txt"
}

zoo() {
  [ $# -gt 0 ] || set -- --jobs 4 --time-limit 420
  python3 -m thunder_fusion_guard bench zoo --device cuda --json "$OUT/zoo-cuda.json" --markdown "$OUT/zoo-cuda.md" "$@"
}

subcommand=${1:-}
[ $# -gt 0 ] && shift
case "$subcommand" in
  -h | --help | help) usage ;;
  acceptance) acceptance "$@" ;;
  check) check ;;
  correctness) correctness ;;
  decisions) decisions ;;
  distributed) exec torchrun --nproc-per-node "${NPROC:-2}" benchmarks/gpu_distributed.py "$@" ;;
  distributed-matrix) distributed_matrix ;;
  flaky) flaky ;;
  hf) exec python3 benchmarks/gpu_hf.py "$@" ;;
  hoist) exec python3 benchmarks/gpu_hoist.py "$@" ;;
  install-check) install_check ;;
  models) exec python3 benchmarks/gpu_models.py "$@" ;;
  pictures) pictures ;;
  run) run "$@" ;;
  why) why ;;
  zoo) zoo "$@" ;;
  zoo-kernels) exec python3 benchmarks/zoo_kernels.py "$@" ;;
  wheels) wheels "$@" ;;
  "") echo "gpu.sh: a subcommand is required (see bash benchmarks/gpu.sh --help)" >&2; exit 2 ;;
  *) echo "gpu.sh: unknown subcommand '$subcommand' (see bash benchmarks/gpu.sh --help)" >&2; exit 2 ;;
esac
