#!/usr/bin/env bash
# Install the GPU dependencies on a CUDA machine without network, from a folder of wheels.
#   on a machine with network, same OS, CPU architecture and Python version as the GPU machine:
#     bash benchmarks/gpu_wheels.sh download WHEELS      # torch 2.10 + nvFuser for it, Thunder, test extras
#   copy WHEELS and the repository over, then on the GPU machine, in a fresh venv:
#     bash benchmarks/gpu_wheels.sh install WHEELS       # pip install --no-index from WHEELS only
set -euo pipefail
cmd=${1:-}; wheels=${2:-}
if [ -z "$cmd" ] || [ -z "$wheels" ]; then
  echo "usage: bash benchmarks/gpu_wheels.sh download|install WHEELS_FOLDER" >&2; exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
case "$cmd" in
  download) mkdir -p "$wheels" && python3 -m pip download -d "$wheels" "$repo[nvfuser,test,models]" ;;
  install) python3 -m pip install --no-index --find-links "$wheels" -e "$repo[nvfuser,test,models]" ;;
  *) echo "gpu_wheels.sh: unknown command '$cmd' (download or install)" >&2; exit 2 ;;
esac
