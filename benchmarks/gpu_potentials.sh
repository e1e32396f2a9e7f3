#!/usr/bin/env bash
# NequIP and MACE from their packages (and the zoo's small e3nn step) on one CUDA GPU, against torch.compile with
# the same whole-step capture (capture_step), by benchmarks/gpu_seed_vs_inductor.py. Each job is a process of its own,
# started side by side so that their compiles overlap on the CPU cores; the jobs time one at a time (TFG_ZOO_LOCK),
# each against its own eager, interleaved. Wheels, installed with no network: .whl/nequip (nequip 0.19, e3nn 0.6 from
# the machine), .whl/mace (mace-torch 0.3.16, e3nn 0.4.4): benchmarks/gpu_wheels.sh downloads both;
# .whl/cueq-site.tar.xz (cuEquivariance 0.13, CUDA 13 ops).
#   source .gpu/setup.sh && TFG_COMMIT=<full sha> [TFG_CACHE_PACK=1] [TFG_STACKS_EVERY=S] bash benchmarks/gpu_potentials.sh [JOB...]
# Writes <job>.json and .log, packed in $OUT/<job>.tgz as each job ends and all in $OUT/potentials.tgz; benchmarks/potentials_table.py makes potentials-<gpu>-<sha>.json of them.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/potentials}"
WORK=/tmp/potentials-work  # every job's files, packed into $OUT/potentials.tgz at the end
mkdir -p "$OUT" "$WORK"
DEADLINE=${TFG_DEADLINE_S:-560}  # seconds from the start of this script; every job is stopped by then
# unguarded Thunder's paths (fx) run nvFuser regions: enable_nvfuser_direct() in every job (nvfuser_direct-only builds)
export TFG_NVFUSER_DIRECT=${TFG_NVFUSER_DIRECT:-1}
export TFG_ZOO_LOCK=/tmp/tfg-potentials.lock
# one guarded compile at a time: the guard's region timings decide its regions, and another job's kernels on the GPU
# meanwhile would skew them (jobs side by side at 76075e4 kept a forward region alone and switched it beside others)
export TFG_ZOO_DECIDE_LOCK=/tmp/tfg-potentials-decide.lock
# every job waits, before it times, until all have compiled (or until 120 s before the deadline): a job compiling,
# and the guard timing its regions, on the GPU would slow the kernels of one being profiled
export TFG_ZOO_READY=$WORK/ready TFG_ZOO_READY_BY=$(( $(date +%s) + DEADLINE - 120 ))
rm -rf "$TFG_ZOO_READY" && mkdir -p "$TFG_ZOO_READY"
[ -d /tmp/nq ] || python3 -m pip install -q --no-deps --no-index --target /tmp/nq .whl/nequip/*.whl
[ -d /tmp/mc ] || python3 -m pip install -q --no-deps --no-index --target /tmp/mc .whl/mace/*.whl
# cuEquivariance's wheels unpacked and packed again with xz (benchmarks/gpu_wheels.sh cueq), for the mace-cueq jobs; with .gpu
# and the tracked files it passes a run's 64 MiB carry: carry it alone first and unpack it into /tmp/cq there
[ -d /tmp/cq ] || [ ! -f .whl/cueq-site.tar.xz ] || { mkdir -p /tmp/cq && tar xJf .whl/cueq-site.tar.xz -C /tmp/cq; }
# Inductor's and Triton's caches travel between machines: with TFG_CACHE_PACK=1 they are packed after the jobs into
# $OUT/inductor-cache.txz.NN (xz, parts of 15 MB: a file comes back at 16 MiB at most); put those parts in
# .whl/inductor-cache/ and carry it, and they are unpacked here before the jobs (NequIP's Inductor step given its
# small-matmul rewrites compiles in 470 s cold, 55 s warm); the packing runs after the jobs' deadline (TFG_DEADLINE_S):
# leave it room under the command's own time limit
export TORCHINDUCTOR_CACHE_DIR=/tmp/tfg-inductor-cache
if [ ! -d "$TORCHINDUCTOR_CACHE_DIR" ] && compgen -G ".whl/inductor-cache/inductor-cache.txz.*" > /dev/null; then
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
  cat .whl/inductor-cache/inductor-cache.txz.* | tar xJf - -C "$TORCHINDUCTOR_CACHE_DIR" \
    && echo "[potentials] Inductor's caches unpacked: $(du -sh "$TORCHINDUCTOR_CACHE_DIR" | cut -f1)"
fi
NQ="/tmp/nq:$PWD/.whl/nequip/pure:${PYTHONPATH:-}"
MC="/tmp/mc:/tmp/cq:${PYTHONPATH:-}"
README='{"choose_executor": true, "exact_only": false, "merge_regions": true, "measure_budget_s": 300}'
MATMULS='{"choose_executor": true, "exact_only": false, "merge_regions": true, "small_matmuls": true, "measure_budget_s": 300}'

# Inductor's best steps found on these models: given its small-matmul rewrites as the guard times them on a whole
# graph, without and with combo kernels (paths of gpu_seed_vs_inductor.py)
INDUCTOR_BEST="--step-graph inductor/decomposed --step-graph inductor/combo-decomposed"

SUMMED=inductor/combo-decomposed-summed
# Inductor's options realizing fewer buffers (more recomputed inline): fewer kernels
UNREALIZED='"realize_opcount_threshold":100,"realize_reads_threshold":16,"realize_acc_reads_threshold":32'
# Inductor handed the guard's pass summing matmuls of up to 65536 result values (a variant of several jobs below)
SUM64K="$SUMMED/sum64k={\"summed_most\":65536}"
# the same with fewer buffers realized: the guarded step's whole-graph program on the small step and MACE
SUM64K_UNREALIZED="$SUMMED/sum64k-unrealized={$UNREALIZED,\"summed_most\":65536}"
# the Inductor variants of the small-kernels jobs (gpu_seed_vs_inductor.py --inductor-variant; JSON without spaces)
ALL='"aggressive_fusion":true,"combo_kernel_allow_mixed_sizes":2,"split_reductions":false,"triton.tiling_prevents_pointwise_fusion":false,"triton.tiling_prevents_reduction_fusion":false'
KERNEL_VARIANTS=$(printf -- '--inductor-variant %s ' \
  "$SUMMED/aggressive={\"aggressive_fusion\":true}" \
  "$SUMMED/mixed={\"combo_kernel_allow_mixed_sizes\":2}" \
  "$SUMMED/unsplit={\"split_reductions\":false}" \
  "$SUMMED/cooperative={\"triton.cooperative_reductions\":true}" \
  "$SUMMED/untiled={\"triton.tiling_prevents_pointwise_fusion\":false,\"triton.tiling_prevents_reduction_fusion\":false}" \
  "$SUMMED/unrealized={$UNREALIZED}" \
  "$SUMMED/sum16k={\"summed_most\":16384}" \
  "$SUM64K" \
  "$SUMMED/all={$ALL}" \
  "$SUMMED/all64k={$ALL,\"summed_most\":65536}")
WIDE_VARIANTS=$(printf -- '--inductor-variant %s ' "inductor/combo-decomposed/unrealized={$UNREALIZED}" \
  "$SUM64K")
# the guard's pass summing matmuls of up to 65536 and of up to 2^20 result values, each with and without fewer buffers
# realized (Inductor's own options): what each would cut from the guarded step's kernels
SUMS_VARIANTS=$(printf -- '--inductor-variant %s ' "$SUM64K" \
  "$SUMMED/sum1m={\"summed_most\":1048576}" "$SUM64K_UNREALIZED" \
  "$SUMMED/sum1m-unrealized={$UNREALIZED,\"summed_most\":1048576}")
# Inductor's coordinate-descent tuning of its Triton kernels' launch configurations (its own option, off by default):
# device time where the step is a queue of Triton kernels, on Inductor's best step and on the guard's summed matmuls
TUNED='"coordinate_descent_tuning":true'
TUNED_VARIANTS=$(printf -- '--inductor-variant %s ' "inductor/combo-decomposed/tuned={$TUNED}" \
  "$SUM64K_UNREALIZED" \
  "$SUMMED/sum64k-unrealized-tuned={$UNREALIZED,$TUNED,\"summed_most\":65536}")
# Inductor's best step found and the guard's pass with fewer buffers realized (the guard's whole-graph program on these
# models), each tuned; a tuned compile takes minutes, so MACE's job leaves out the guard's pass tuned
TUNED_PATHS="--step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed/tuned --step-graph $SUMMED/sum64k-unrealized"

declare -A JOBS=(
  [nequip-inductor]="$NQ|--model nequip --paths eager,inductor-ro --step-graph inductor"
  [nequip-inductor-step]="$NQ|--model nequip --paths eager --step-graph inductor"
  [nequip-guarded]="$NQ|--model nequip --paths eager --step-graph fx-guarded"
  [nequip-graphs]="$NQ|--model nequip --paths eager,fx-guarded+cudagraph"
  [nequip-readme]="$NQ|--model nequip --paths eager --step-graph fx-guarded/readme"
  [nequip-untranslated]="$NQ|--model nequip --no-translate --paths eager --step-graph fx-guarded"
  [nequip-inductor-untranslated]="$NQ|--model nequip --no-translate --paths eager --step-graph inductor"
  [nequip-backends]="$NQ|--model nequip --no-translate --paths eager --step-graph inductor --step-graph fx-guarded+backends --thread-stack-mb 1024"
  [nequip-backends-both]="$NQ|--model nequip --no-translate --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded+backends --thread-stack-mb 1024"
  [nequip-jit]="$NQ|--model nequip --no-translate --paths eager,guarded"
  [mace-inductor]="$MC|--model mace --no-translate --paths eager,inductor-ro --step-graph inductor"
  [mace-guarded]="$MC|--model mace --no-translate --paths eager --step-graph fx-guarded --thread-stack-mb 1024"
  [mace-translated]="$MC|--model mace --paths eager --step-graph fx-guarded"
  [mace-readme]="$MC|--model mace --paths eager --step-graph fx-guarded/readme"
  [mace-interleaved]="$MC|--model mace --no-translate --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded --thread-stack-mb 1024"
  [nequip-interleaved]="$NQ|--model nequip --no-translate --paths eager --step-graph inductor --step-graph fx-guarded --thread-stack-mb 1024"
  [mace-cueq-inductor]="$MC|--model mace-cueq --no-translate --paths eager,inductor-ro --step-graph inductor"
  [mace-cueq-guarded]="$MC|--model mace-cueq --no-translate --paths eager --step-graph fx-guarded --thread-stack-mb 1024"
  [mace-inductor-combo]="$MC|--model mace --no-translate --paths eager --step-graph inductor --inductor-config combo_kernels=true"
  [nequip-jit-vjps]="$NQ|--model nequip --no-translate --paths eager,guarded"
  [small-inductor-step]="|--model small --paths eager --step-graph inductor"
  [small-step-combo]="|--model small --paths eager --step-graph inductor --inductor-config combo_kernels=true"
  [small-step-combo-aggressive]="|--model small --paths eager --step-graph inductor --inductor-config combo_kernels=true --inductor-config aggressive_fusion=true"
  [modules-step]="|--model e3nn-nequip-modules --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/readme"
  [small-graphs]="|--model small --paths eager,inductor-ro,fx-guarded+cudagraph"
  [small-step]="|--model small --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/readme"
  [small-matmuls]="|--model small --paths eager,inductor-ro --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/matmuls"
  [mace-matmuls]="$MC|--model mace --paths eager --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [mace-inductor-both]="$MC|--model mace --no-translate --paths eager --step-graph inductor --step-graph inductor/combo --thread-stack-mb 1024"
  [modules-matmuls]="|--model e3nn-nequip-modules --paths eager,inductor-ro --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/matmuls"
  [small-matmuls-combo]="|--model small --paths eager --step-graph inductor --step-graph fx-guarded/matmuls --inductor-config combo_kernels=true"
  [nequip-combo-step]="$NQ|--model nequip --paths eager --step-graph inductor/combo"
  [nequip-matmuls-alone]="$NQ|--model nequip --paths eager --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [nequip-matmuls]="$NQ|--model nequip --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [mace-matmuls-interleaved]="$MC|--model mace --paths eager --step-graph inductor --step-graph inductor/combo --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [nequip-unguarded]="$NQ|--model nequip --paths eager,fx"
  [small-unguarded]="|--model small --paths eager,fx"
  [modules-unguarded]="|--model e3nn-nequip-modules --paths eager,fx"
  [nequip-eager]="$NQ|--model nequip --paths eager"
  [small-eager]="|--model small --paths eager"
  [small-matmuls-forces]="|--model small --paths eager --step-graph fx-guarded/matmuls"
  [modules-eager]="|--model e3nn-nequip-modules --paths eager"
  [mace-inductor-decomposed]="$MC|--model mace --paths eager $INDUCTOR_BEST --thread-stack-mb 1024"
  [nequip-inductor-decomposed]="$NQ|--model nequip --paths eager $INDUCTOR_BEST --thread-stack-mb 1024"
  [small-inductor-decomposed]="|--model small --paths eager $INDUCTOR_BEST"
  [modules-inductor-decomposed]="|--model e3nn-nequip-modules --paths eager $INDUCTOR_BEST"
  [mace-decomposed-interleaved]="$MC|--model mace --paths eager $INDUCTOR_BEST --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [nequip-decomposed-interleaved]="$NQ|--model nequip --paths eager $INDUCTOR_BEST --step-graph fx-guarded/matmuls --thread-stack-mb 1024"
  [small-decomposed-interleaved]="|--model small --paths eager $INDUCTOR_BEST --step-graph fx-guarded/matmuls"
  [modules-decomposed-interleaved]="|--model e3nn-nequip-modules --paths eager $INDUCTOR_BEST --step-graph fx-guarded/matmuls"
  [small-backends-decomposed]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends"
  # cold, Inductor's NequIP compiles take 437 + 66 s, and the guarded first call 285-295 s on an H100 before the choice
  # (cdf0328): it does not fit one job cold; run nequip-fill-inductor and nequip-backends-alone first on the same machine,
  # the next call within its idle release, or with TFG_CACHE_PACK=1 and the caches carried
  [nequip-backends-decomposed]="$NQ|--model nequip --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends --thread-stack-mb 1024 --time-before-choice"
  # the compiles of the guard's whole-graph choice alone, into Inductor's caches: the guarded path without a fusion
  # executor (variant fx-guarded+backends/none) reaches its choice after a first call of about a minute, where nvFuser's
  # regions take minutes more; Dynamo's graph and its inputs, so the compiles' cache keys, are the same. It takes no
  # decide lock (what it decides is not kept); nequip-backends-decomposed on the same machine then reads them
  [nequip-whole-compiles]="$NQ|--model nequip --paths eager --step-graph fx-guarded+backends/none --thread-stack-mb 1024"
  # its guarded path alone, beside nequip-inductor-decomposed in the call before: both fill Inductor's caches
  [nequip-backends-alone]="$NQ|--model nequip --paths eager --step-graph fx-guarded+backends --thread-stack-mb 1024 --time-before-choice"
  # the same guarded step with Thunder's torch.compile executor as its one fusion executor (variant fx-guarded+backends/tc):
  # its regions compile by Inductor and are read from Inductor's caches, where nvFuser's compiles (168-189 s of NequIP's
  # guarded first call on an H100, a390948) are kept by none; nequip-whole-compiles alone, then beside
  # nequip-backends-tc-alone, fill them on one machine (each call within its idle release, or TFG_CACHE_PACK=1 and the
  # caches carried), then nequip-backends-tc times it beside Inductor's best step in one process (H100: 555, 401, 219 s)
  [nequip-backends-tc-alone]="$NQ|--model nequip --paths eager --step-graph fx-guarded+backends/tc --thread-stack-mb 1024 --time-before-choice"
  [nequip-backends-tc]="$NQ|--model nequip --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends/tc --thread-stack-mb 1024 --time-before-choice"
  # the same three at l_max 3, in that order on one machine
  [nequip-l3-whole-compiles]="$NQ|--model nequip-l3 --paths eager --step-graph fx-guarded+backends/none --thread-stack-mb 1024"
  [nequip-l3-backends-tc-alone]="$NQ|--model nequip-l3 --paths eager --step-graph fx-guarded+backends/tc --thread-stack-mb 1024 --time-before-choice"
  [nequip-l3-backends-tc]="$NQ|--model nequip-l3 --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends/tc --thread-stack-mb 1024 --time-before-choice"
  # at l_max 3 with no fusion executor too: Inductor's best step compiled into the caches beside the cache-filling
  # variant (TFG_CACHE_PACK=1 packs both for a later machine), then the two timed in one process from warm caches
  [nequip-l3-inductor-fill]="$NQ|--model nequip-l3 --paths eager --step-graph inductor/combo-decomposed --thread-stack-mb 1024"
  [nequip-l3-backends-none]="$NQ|--model nequip-l3 --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends/none --thread-stack-mb 1024 --time-before-choice"
  # the same two with choose_backends given option_compiles_s=50, one process on a cold machine: the compile with all
  # of Inductor's options (57 s on an H100) is then the last started; with fewer buffers realized after it, Inductor's
  # compile ran 340 s and failed (its compile workers gone), H100 and H200
  [nequip-l3-backends-none-capped]="$NQ|--model nequip-l3 --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends/none --thread-stack-mb 1024 --option-compiles-s 50"
  # MACE translated, the guarded step after choose_backends(whole_graphs=True) beside Inductor's best step, one process;
  # the jobs given --time-before-choice also time the guarded step before its choice (a row keyed "... before choice")
  [mace-backends-decomposed]="$MC|--model mace --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends --thread-stack-mb 1024 --time-before-choice"
  # one process a model, every path the kernel-count comparison names: eager, Inductor's reduce-overhead mode, its
  # default step and its best steps found, each captured whole, and the guard's e3nn configuration + small_matmuls
  [modules-steps]="|--model e3nn-nequip-modules --paths eager,inductor-ro --step-graph inductor $INDUCTOR_BEST --step-graph fx-guarded/matmuls"
  # the guarded step in README's e3nn configuration + small_matmuls beside Inductor's fastest step found on each model
  # (in modules-steps and small-steps), one process a model: each fits one 600 s call
  [modules-fastest]="|--model e3nn-nequip-modules --paths eager --step-graph inductor --step-graph fx-guarded/matmuls"
  [small-fastest]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded/matmuls"
  [small-steps]="|--model small --paths eager,inductor-ro --step-graph inductor $INDUCTOR_BEST --step-graph fx-guarded/matmuls"
  # MACE at max_ell 3 the same way as mace-backends-decomposed, one process
  [mace-l3-backends]="$MC|--model mace-l3 --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded+backends --thread-stack-mb 1024 --time-before-choice"
  # MACE by cuEquivariance's kernels (its enable_cueq), translated: Inductor's default and best steps beside the
  # guarded step after choose_backends(whole_graphs=True), one process; needs .whl/cueq-site.tar.xz unpacked once
  [mace-cueq-backends]="$MC|--model mace-cueq --paths eager --step-graph inductor $INDUCTOR_BEST --step-graph fx-guarded+backends --thread-stack-mb 1024"
  # the guarded step after choose_backends(whole_graphs=True), which may hand Inductor the guard's summed matmuls,
  # beside Inductor's best step found and Inductor handed that pass too, one process a model
  [small-backends-summed]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed-summed --step-graph fx-guarded+backends"
  [modules-backends-summed]="|--model e3nn-nequip-modules --paths eager --step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed-summed --step-graph fx-guarded+backends"
  # the small step's kernels: Inductor handed the guard's pass, and given more of its own fusion options each
  # (aggressive fusion, combo kernels of mixed sizes, unsplit or cooperative reductions, fusion across tilings, fewer
  # buffers realized, a larger summed-matmul threshold), one process a half
  [small-kernels-a]="|--model small --paths eager --step-graph $SUMMED --step-graph $SUMMED/aggressive --step-graph $SUMMED/mixed --step-graph $SUMMED/unsplit --step-graph $SUMMED/cooperative $KERNEL_VARIANTS"
  [small-kernels-b]="|--model small --paths eager --step-graph $SUMMED/untiled --step-graph $SUMMED/unrealized --step-graph $SUMMED/sum16k --step-graph $SUMMED/sum64k --step-graph $SUMMED/all --step-graph $SUMMED/all64k $KERNEL_VARIANTS"
  # the guarded step after choose_backends(whole_graphs=True), which may sum larger-result matmuls too, beside
  # Inductor's best step found, Inductor given fewer buffers realized (its own options) and Inductor handed the
  # guard's wider pass, one process a model
  [small-backends-wide]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed/unrealized --step-graph $SUMMED/sum64k --step-graph fx-guarded+backends $WIDE_VARIANTS"
  [mace-backends-wide]="$MC|--model mace --paths eager --step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed/unrealized --step-graph fx-guarded+backends --thread-stack-mb 1024 $WIDE_VARIANTS"
  # the guarded step after choose_backends(whole_graphs=True), compiled first (no compile of Inductor's before it in
  # the process to reuse from its cache), beside Inductor's best step found, one process a model
  [small-backends-all]="|--model small --paths eager --step-graph fx-guarded+backends --step-graph inductor/combo-decomposed"
  [mace-backends-all]="$MC|--model mace --paths eager --step-graph fx-guarded+backends --step-graph inductor/combo-decomposed --thread-stack-mb 1024"
  # e3nn-nequip-modules the same way, beside Inductor's default step (its fastest on this model) and its best found on the others
  [modules-backends-all]="|--model e3nn-nequip-modules --paths eager --step-graph fx-guarded+backends --step-graph inductor --step-graph inductor/combo-decomposed"
  # the small step by Inductor handed the guard's pass with larger thresholds, with and without fewer buffers realized
  [small-sums-wider]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph $SUMMED/sum64k --step-graph $SUMMED/sum1m --step-graph $SUMMED/sum64k-unrealized --step-graph $SUMMED/sum1m-unrealized $SUMS_VARIANTS"
  # the small step by Inductor handed the guard's pass at its first threshold (4096 result values) and at the wider one
  # (65536), each with and without fewer buffers realized: which of the guard's stacks has both fewer kernels and less
  # device time than Inductor's best step, in one process
  [small-sums-realized]="|--model small --paths eager --step-graph inductor/combo-decomposed --step-graph $SUMMED --step-graph $SUMMED/unrealized --step-graph $SUMMED/sum64k --step-graph $SUMMED/sum64k-unrealized $(printf -- '--inductor-variant %s ' "$SUMMED/unrealized={$UNREALIZED}") $SUMS_VARIANTS"
  # the small step and MACE by Inductor, its best step found and handed the guard's pass, each with and without its
  # coordinate-descent tuning, one process a model
  [small-tuned]="|--model small --paths eager $TUNED_PATHS --step-graph $SUMMED/sum64k-unrealized-tuned $TUNED_VARIANTS"
  # e3nn-nequip-modules the same way, from Inductor's default step (its fastest on this model)
  [modules-tuned]="|--model e3nn-nequip-modules --paths eager --step-graph inductor --step-graph inductor/tuned --step-graph $SUMMED/sum64k --step-graph $SUMMED/sum64k-tuned $(printf -- '--inductor-variant %s ' "inductor/tuned={$TUNED}" "$SUM64K" "$SUMMED/sum64k-tuned={$TUNED,\"summed_most\":65536}")"
  # the guarded step in README's e3nn configuration + small_matmuls, compiled first, beside Inductor's default step and
  # that step tuned (its fastest found on this model), one process
  [modules-tuned-guarded]="|--model e3nn-nequip-modules --paths eager --step-graph fx-guarded/matmuls --step-graph inductor --step-graph inductor/tuned --inductor-variant inductor/tuned={$TUNED}"
  [mace-tuned]="$MC|--model mace --paths eager $TUNED_PATHS --thread-stack-mb 1024 $TUNED_VARIANTS"
  # NequIP translated, guarded after choose_backends(whole_graphs=True), beside Inductor's best step found and that step
  # tuned, one process; cold, NequIP's compiles take minutes each: the two fill jobs and nequip-backends-alone first,
  # side by side on the same machine (its caches kept between calls while it stays warm, or TFG_CACHE_PACK=1)
  [nequip-fill-inductor]="$NQ|--model nequip --paths eager --step-graph inductor/combo-decomposed --thread-stack-mb 1024"
  [nequip-fill-tuned]="$NQ|--model nequip --paths eager --step-graph inductor/combo-decomposed/tuned --thread-stack-mb 1024 --inductor-variant inductor/combo-decomposed/tuned={$TUNED}"
  [nequip-tuned]="$NQ|--model nequip --paths eager --step-graph fx-guarded+backends --step-graph inductor/combo-decomposed --step-graph inductor/combo-decomposed/tuned --thread-stack-mb 1024 --inductor-variant inductor/combo-decomposed/tuned={$TUNED}"
  # that they run, uncaptured, one compile a process: guarded ThunderFX untranslated and translated at l_max 3 and
  # max_ell 3, guarded thunder.jit on NequIP (MACE's TorchScript is refused there) with nvFuser, Thunder's default
  # fusion executor; their forces against eager's. These take no decide lock: the values are what they report, and
  # NequIP's guarded first calls (about 290 s each on an H100) one at a time would not fit a call
  [nequip-fx-runs]="$NQ|--model nequip --no-translate --paths eager,fx-guarded --thread-stack-mb 1024"
  [nequip-l3-fx-runs]="$NQ|--model nequip-l3 --no-translate --paths eager,fx-guarded --thread-stack-mb 1024"
  [nequip-l3-translated-runs]="$NQ|--model nequip-l3 --paths eager,fx-guarded --thread-stack-mb 1024"
  # the same with Thunder's torch.compile executor as its one fusion executor (README's advice for NequIP translated on
  # CUDA; path fx-guarded/tc): with nvFuser its first call did not end alone in 575 s (nvFuser's compiles, which no
  # cache keeps, and the halves of a backward region nvFuser asserts on); Inductor's caches keep these compiles
  [nequip-l3-translated-tc-runs]="$NQ|--model nequip-l3 --paths eager --thread-stack-mb 1024"
  # the same without the whole-graph option (path fx-guarded/tc-split): where the first-call check rescues a region, that
  # option times Inductor's whole graph at the second call (its compiles about 3 min on an H100, 65888fe), and the
  # job's time ran out there before its values were compared
  [nequip-l3-translated-tc-split-runs]="$NQ|--model nequip-l3 --paths eager --thread-stack-mb 1024"
  # that path's whole step captured beside Inductor's best step found, one process: the table's NequIP l_max 3 row with
  # Thunder's torch.compile executor (its forces compared before the timing, kept should the job be stopped)
  [nequip-l3-tc-split-step]="$NQ|--model nequip-l3 --paths eager --step-graph inductor/combo-decomposed --step-graph fx-guarded/tc-split --thread-stack-mb 1024"
  # the same beside unguarded ThunderFX on the same executor (path fx/tc), compiled first, one process: whether a force
  # that differs from eager's is Thunder's and Inductor's (both paths alike, bit for bit) or the guard's
  [nequip-l3-translated-tc-pair-runs]="$NQ|--model nequip-l3 --paths eager --thread-stack-mb 1024"
  [nequip-jit-runs]="$NQ|--model nequip --no-translate --paths eager,guarded --thread-stack-mb 1024"
  [nequip-jit-translated-runs]="$NQ|--model nequip --paths eager,guarded --thread-stack-mb 1024"
  [mace-fx-runs]="$MC|--model mace --no-translate --paths eager,fx-guarded --thread-stack-mb 1024"
  [mace-l3-fx-runs]="$MC|--model mace-l3 --no-translate --paths eager,fx-guarded --thread-stack-mb 1024"
  [modules-matmuls-combo]="|--model e3nn-nequip-modules --paths eager --step-graph inductor --step-graph fx-guarded/matmuls --inductor-config combo_kernels=true"
)
chosen=("$@")
[ ${#chosen[@]} -eq 0 ] && chosen=("${!JOBS[@]}")
for job in "${chosen[@]}"; do
  [ -n "${JOBS[$job]:-}" ] || { echo "unknown job $job (jobs: ${!JOBS[*]})" >&2; exit 2; }
done
left=$((DEADLINE - SECONDS))
echo "[potentials] $(date -u +%H:%M:%S) ${#chosen[@]} jobs, ${left} s each at most; $(nproc) cores"
export TFG_ZOO_JOBS=${#chosen[@]}
# TFG_STACKS_EVERY=S: every job's threads' stacks sampled every S seconds into <job>.stacks.txt, its warnings
# timestamped (benchmarks/stack_samples.py): where a first call that reaches the deadline spends its time
STACKS_EVERY=${TFG_STACKS_EVERY:-}
sampled=()
[ -n "$STACKS_EVERY" ] && sampled=(benchmarks/stack_samples.py)
for job in "${chosen[@]}"; do
  path=${JOBS[$job]%%|*}
  args=${JOBS[$job]#*|}
  variant=()
  [[ $args == *fx-guarded/readme* ]] && variant+=(--variant "fx-guarded/readme=$README")
  [[ $args == *fx-guarded/matmuls* ]] && variant+=(--variant "fx-guarded/matmuls=$MATMULS")
  [[ $args == *fx-guarded+backends/tc* ]] && variant+=(--variant 'fx-guarded+backends/tc={"fusion": "torchcompile"}')
  lock=$TFG_ZOO_DECIDE_LOCK
  # the cache-filling variant (no fusion executor) takes no decide lock: what it decides is not kept
  [[ $args == *fx-guarded+backends/none* ]] && variant+=(--variant 'fx-guarded+backends/none={"fusion": "none"}') && lock=
  # see the runs jobs above: their values kept should they be stopped while they wait to time
  [[ $job == *-runs ]] && lock= && variant+=(--compare-first)
  [[ $job == *-tc-pair-runs ]] && variant+=(--variant 'fx/tc={"fusion": "torchcompile"}')
  [[ $job == *-tc-runs || $job == *-tc-pair-runs ]] && variant+=(--variant 'fx-guarded/tc={"fusion": "torchcompile"}')
  [[ $job == *-tc-split-* ]] && variant+=(--variant 'fx-guarded/tc-split={"fusion": "torchcompile", "runtime": {"whole_graphs": false}}')
  [[ $job == *-tc-split-step ]] && variant+=(--compare-first)
  [[ $job == nequip-jit-vjps ]] && variant=(--variant 'guarded/without-exact-vjps={"runtime": {"exact_vjps": false}}')
  (
    # shellcheck disable=SC2086
    TFG_ZOO_DECIDE_LOCK=$lock PYTHONPATH=${path:-${PYTHONPATH:-}} DIAG_STACKS=$WORK/$job.stacks.txt DIAG_EVERY=$STACKS_EVERY \
      timeout -k 10 -s INT "$left" python3 "${sampled[@]}" benchmarks/gpu_seed_vs_inductor.py $args \
      "${variant[@]}" --rounds 20 --json "$WORK/$job.json" > "$WORK/$job.log" 2>&1
    echo "[potentials] $(date -u +%H:%M:%S) $job exit $?"
    # each job's files in $OUT as soon as it ends: a command stopped from outside before the packing below keeps them
    tar czf "$OUT/$job.tgz" -C "$WORK" "$job.json" "$job.log" $([ -n "$STACKS_EVERY" ] && echo "$job.stacks.txt") 2>/dev/null
  ) &
done
wait
tar czf "$OUT/potentials.tgz" -C "$WORK" .
if [ "${TFG_CACHE_PACK:-0}" = 1 ] && [ -d "$TORCHINDUCTOR_CACHE_DIR" ]; then
  rm -f "$OUT"/inductor-cache.txz.*
  tar cf - -C "$TORCHINDUCTOR_CACHE_DIR" . | xz -6 -T0 | split -b 15M -d - "$OUT/inductor-cache.txz."
  echo "[potentials] Inductor's caches packed: $(du -sh "$TORCHINDUCTOR_CACHE_DIR" | cut -f1) into $(du -ch "$OUT"/inductor-cache.txz.* | tail -1 | cut -f1)"
fi
for job in "${chosen[@]}"; do grep -h "^\[" "$WORK/$job.log" | grep -v "first_call_s': [0-9.]*}$" | cut -c1-300 | tail -4; done
