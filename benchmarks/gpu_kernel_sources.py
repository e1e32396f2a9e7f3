"""The small e3nn step's kernels by source, beside Inductor's best: guarded ThunderFX in README's e3nn configuration +
``small_matmuls``, 300 s to time regions, as ``gpu_potentials.sh`` runs it (compiled as ``capture_step`` compiles
it), and Inductor given combo kernels and its small-matmul rewrites; with each matmul left outside a fusion region
(shapes, readers, the user's line) and the guard's matmul decisions. CUDA; on CPU it stops after the matmuls
(torch.compile's regions hold them all there).

    source .gpu/setup.sh && OUT=<folder> python benchmarks/gpu_kernel_sources.py

Writes kernels.txt's tables to stdout and ``guarded-kernels.json``, ``inductor-kernels.json``, ``matmuls.json``,
``decisions.json`` and each subgraph's final traces to $OUT."""

import json
import os
import sys
import time
import traceback

import thunder
import torch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_seed_vs_inductor as g

from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard import translate_library_ops
from thunder_fusion_guard.bench.zoo_equivariant import e3nn_nequip_small
from thunder_fusion_guard.bench.zoo_paths import ZooPath
from thunder_fusion_guard.examine.kernel_histogram import format_histograms, step_histogram
from thunder_fusion_guard.ops import MATMUL_OPS
from thunder_fusion_guard.options import nested
from thunder_fusion_guard.passes.rewrite import readers
from thunder_fusion_guard.whole_graph import decomposed_matmuls


def main() -> None:
    translate_library_ops()
    out = os.environ.get("OUT", "/tmp/kernel-sources")
    os.makedirs(out, exist_ok=True)
    cuda = torch.cuda.is_available()
    # gpu_potentials.sh's guarded e3nn path (its $MATMULS): README's e3nn configuration, small_matmuls, 300 s to time
    options = {"choose_executor": cuda, "exact_only": False, "merge_regions": True}
    options |= {"small_matmuls": True, "measure_budget_s": 300}
    model = g.MODELS["small"]() if cuda else e3nn_nequip_small("cpu")
    began = time.time()
    fn, guard = g._compile(model.module, ZooPath.parse("fx-guarded"), "cuda" if cuda else "cpu", nested(options))
    if cuda:
        step = g._CapturedStep(model, fn)
        step()
        print("captured:", step.captured.captured or step.captured.reason)
    else:
        model.loss(fn(*model.inputs)).backward()
    print(f"guarded first call {time.time() - began:.1f} s", flush=True)
    decisions = [d.to_dict() for d in guard.report.decisions if d.code.startswith("matmul") or d.action == "rescue"]
    with open(f"{out}/decisions.json", "w") as f:
        json.dump(decisions, f, indent=1, default=str)
    rows = outside_matmuls(fn, out)
    with open(f"{out}/matmuls.json", "w") as f:
        json.dump(rows, f, indent=1, default=str)
    print(f"{len(rows)} matmuls outside regions", flush=True)
    if not cuda:
        return
    histograms = [step_histogram("guarded", fn, model.inputs, {}, backward=True)]
    with open(f"{out}/guarded-kernels.json", "w") as f:
        json.dump(histograms[0].to_dict(), f)
    try:
        with decomposed_matmuls():
            inductor = torch.compile(model.module, options=g.INDUCTOR_OPTIONS[g.INDUCTOR_COMBO_DECOMPOSED])
            histograms.append(step_histogram("inductor", inductor, model.inputs, {}, backward=True))
        with open(f"{out}/inductor-kernels.json", "w") as f:
            json.dump(histograms[1].to_dict(), f)
    except Exception:  # Inductor's failure still leaves the guarded histogram printed
        traceback.print_exc()
    print(format_histograms(histograms, top=80, wide=True), flush=True)


def outside_matmuls(fn: object, out: str) -> list[dict]:
    """Each matmul of the final traces run outside a fusion region: shapes, the ops reading it, the user's line;
    each trace written to ``out``."""
    rows = []
    for sub in th.thunderfx_subgraphs(fn):
        for kind, traces in (
            ("forward", thunder.last_traces(sub.jitted)),
            ("backward", thunder.last_backward_traces(sub.jitted)),
        ):
            if not traces:
                continue
            trace = traces[-1]
            with open(f"{out}/{sub.name}-{kind}.py", "w") as f:
                f.write(str(trace))
            bsyms = list(trace.bound_symbols)
            readers_of = readers(bsyms)
            for b in bsyms:
                if th.op_name(b) in MATMUL_OPS:
                    o = b.flat_proxy_outs[0]
                    users = [th.op_name(bsyms[k]) for k in sorted(readers_of.get(o.name, ()))]
                    shapes = [list(a.shape) for a in b.flat_proxy_args if hasattr(a, "shape")]
                    rows.append(
                        {"subgraph": sub.name, "trace": kind, "op": b.sym.name, "in": shapes, "out": list(o.shape)}
                        | {"readers": users, "line": th.source_line(b)}
                    )
    return rows


if __name__ == "__main__":
    main()
