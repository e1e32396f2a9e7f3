#!/usr/bin/env bash
# The wheels benchmarks/gpu_potentials.sh installs on a CUDA machine without network (Python 3.12, x86-64 Linux),
# downloaded here into .whl/ (keep it out of git: `printf '/.whl/\n' >> .git/info/exclude`; carry it with the run):
#   .whl/nequip       nequip 0.19.1 and what building its model imports beyond torch, numpy, scipy, e3nn 0.6 and
#                     transformers' dependencies (hydra-core, omegaconf, lightning, torchmetrics, matscipy, ase);
#   .whl/nequip/pure  antlr4-python3-runtime 4.9.3 (hydra's pin; published as a source archive only), unpacked;
#   .whl/mace         mace-torch 0.3.16 with e3nn 0.4.4, its pin, and its imports;
#   .whl/cueq-site.tar.xz  cuEquivariance 0.13.0 for torch with its CUDA 13 ops and platformdirs, unpacked as a
#                     site folder and packed with xz (about 28 MiB against 74 MB of wheels). With the tracked files and .gpu it
#                     passes the 64 MiB a run carries: carry it alone in a call of its own first (unpack it into
#                     /tmp/cq there), then run the mace-cueq jobs on the same machine while it is warm.
#   bash benchmarks/gpu_wheels.sh [nequip] [mace] [cueq]
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
get() {  # get DIR REQUIREMENT...: binary wheels for CPython 3.12 on manylinux x86-64 (or pure Python), no dependencies
  local dir=$1
  shift
  mkdir -p "$dir"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dir" "$@"
}
kits=("$@")
[ ${#kits[@]} -eq 0 ] && kits=(nequip mace cueq)
for k in "${kits[@]}"; do  # every name checked before any download
  [[ $k == nequip || $k == mace || $k == cueq ]] || { echo "unknown kit $k (kits: nequip, mace, cueq)" >&2; exit 2; }
done
for k in "${kits[@]}"; do
  case $k in
    nequip)
      get .whl/nequip nequip==0.19.1 hydra-core==1.3.8 omegaconf==2.3.0 lightning lightning-utilities torchmetrics \
        matscipy ase
      tmp=$(mktemp -d)
      "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" antlr4-python3-runtime==4.9.3
      tar xzf "$tmp"/antlr4-python3-runtime-4.9.3.tar.gz -C "$tmp"
      mkdir -p .whl/nequip/pure && rm -rf .whl/nequip/pure/antlr4
      cp -r "$tmp"/antlr4-python3-runtime-4.9.3/src/antlr4 .whl/nequip/pure/
      rm -rf "$tmp"
      ;;
    mace)
      get .whl/mace mace-torch==0.3.16 e3nn==0.4.4 ase pandas torchmetrics torch-ema prettytable opt-einsum opt-einsum-fx
      ;;
    cueq)
      tmp=$(mktemp -d)
      get "$tmp/wheels" cuequivariance==0.13.0 cuequivariance-torch==0.13.0 cuequivariance-ops-torch-cu13==0.13.0 \
        cuequivariance-ops-cu13==0.13.0 platformdirs
      for w in "$tmp"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$tmp/site"; done  # a wheel is its site files, zipped
      mkdir -p .whl && tar cf - -C "$tmp/site" . | xz -6 -T0 > .whl/cueq-site.tar.xz
      rm -rf "$tmp"
      ;;
  esac
done
du -sh .whl/*
