"""Seconds of the guard's own Inductor compile of MACE's Dynamo graph (``fx_rescue.compile_fx_module``: how the
guard compiles a whole graph, an Inductor rescue or a timed backend), forward and backward, in a process with an empty
Inductor cache and then in a second process reading the cache the first wrote: what a restarted job pays again.

    PYTHONPATH=<mace-torch's environment> OMP_NUM_THREADS=1 python benchmarks/cpu_compile_cache.py --json out.json

Each process compiles the largest Dynamo graph of MACE (``translate_library_ops()``, 30 atoms) once; Inductor's cache
counters say whether its FX-graph cache was bypassed, missed or hit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from package_hash import package_sha256, resolve_commit  # noqa: E402


def compile_once() -> dict:
    """One compile, in this process: its seconds, the graph's nodes and Inductor's FX-graph cache counters."""
    from split_checks import dynamo_graphs
    from torch._dynamo.utils import counters

    from thunder_fusion_guard import translate_library_ops
    from thunder_fusion_guard.bench.zoo_potentials import mace_potential
    from thunder_fusion_guard.fx_rescue import compile_fx_module
    from thunder_fusion_guard.whole_graph import forward_backward_step

    translate_library_ops()
    model = mace_potential("cpu", atoms=30)
    gm, inputs = max(dynamo_graphs(model.module, tuple(model.inputs)), key=lambda g: len(g[0].graph.nodes))
    began = time.perf_counter()
    forward_backward_step(compile_fx_module(gm, inputs, "inductor"), inputs)()
    cache = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    return {"compile_s": round(time.perf_counter() - began, 1), "nodes": len(gm.graph.nodes), "fxgraph": cache}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # the child: one compile, JSON out
    args = parser.parse_args()
    if args.once:
        args.json.write_text(json.dumps(compile_once()))
        return 0
    runs = {}
    with tempfile.TemporaryDirectory() as cache:
        for run in ("cold", "warm"):
            out = Path(cache) / f"{run}.json"
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(cache) / "inductor")}
            subprocess.run([sys.executable, __file__, "--once", "--json", str(out)], env=env, check=True)
            runs[run] = json.loads(out.read_text())
            print(run, runs[run], flush=True)
    import torch

    record = {"commit": resolve_commit(None)[0], "package_sha256": package_sha256(), "torch": torch.__version__}
    record["model"] = "mace, translated, 30 atoms, CPU, one thread"
    args.json.write_text(json.dumps({**record, **runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
