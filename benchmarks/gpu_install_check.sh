#!/usr/bin/env bash
# Issue 16 on a CUDA machine, < 4 min: the README snippets on CUDA, the CLI there (--version, demo), and
# an nvFuser that fails to load named as such. The kit's nvFuser is the build for torch 2.10, loaded on
# the machine's torch 2.11 only through lazy symbol binding (its sitecustomize.py); without that it
# fails to load, as it would after 'pip install .' next to torch 2.11.
#
#   source .gpu/setup.sh && bash benchmarks/gpu_install_check.sh
#
# Writes $OUT/install_check.txt; the summary comes last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/install_check.txt"
: > "$LOG"
RESULTS=()
check() {  # check NAME EXPECTED_STATUS COMMAND...: run, log, record pass/fail by exit status
  local name=$1 want=$2
  shift 2
  echo "== $name: $*" >> "$LOG"
  "$@" >> "$LOG" 2>&1
  local got=$?
  RESULTS+=("$name: exit $got (want $want) $([ "$got" = "$want" ] && echo ok || echo FAILED)")
}

check "version" 0 python3 -m thunder_fusion_guard --version
check "readme-snippets-cuda" 0 python3 -m pytest -q -p no:logging -m cuda tests/test_readme.py
check "executors-and-cli-tests" 0 python3 -m pytest -q -p no:logging tests/test_executors.py tests/test_cli.py
check "demo-cuda" 0 python3 -m thunder_fusion_guard demo --device cuda --reps 50

# The same kit without lazy symbol binding: the torch 2.10 nvFuser build next to torch 2.11.
STRICT=$(mktemp -d)
for entry in /tmp/site/* /tmp/site/.[!.]*; do
  [ -e "$entry" ] && [ "$(basename "$entry")" != sitecustomize.py ] && ln -s "$entry" "$STRICT/"
done
STRICT_PATH="$STRICT:$PWD"
check "strict-nvfuser-problem" 0 env PYTHONPATH="$STRICT_PATH" python3 -c "
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
check "strict-calibrate-nvfuser" 2 env PYTHONPATH="$STRICT_PATH" python3 -m thunder_fusion_guard calibrate --executor nvfuser --no-save
check "strict-readme-snippets" 0 env PYTHONPATH="$STRICT_PATH" python3 -m pytest -q -p no:logging tests/test_readme.py
rm -rf "$STRICT"

grep -v -i "warn" "$LOG" | tail -60
echo
echo "summary:"
printf '  %s\n' "${RESULTS[@]}"
