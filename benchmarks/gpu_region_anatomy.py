"""Where a zoo model's guarded ThunderFX step goes on a CUDA GPU, region by region: README's e3nn configuration
(``translate_library_ops()``, ``choose_executor``, ``exact_only=False``, ``merge_regions``), four uncaptured steps,
then the kernels of one more by kind and by the fusion region that launched them (the package's ``step_histogram``,
as ``fusion-guard kernels`` counts them), the kernels each nvFuser region launches (``collect_segments``: names,
schedulers), each subgraph's last forward and backward trace (to read a region's ops) and the guard's report.

    source .gpu/setup.sh && OUT=DIR python3 benchmarks/gpu_region_anatomy.py [MODEL] [--no-merge-regions] \
        [--matmuls] [--captured] [--against-inductor] [--profile-captured]

MODEL: a zoo model (default e3nn-nequip-modules); --no-merge-regions: the same without ``merge_regions``;
--matmuls: with ``rewrites.small_matmuls``; --captured: compiled as ``capture_step``'s warm-up compiles (the guard
decides on device estimates); --against-inductor: torch.compile's step too (defaults, and with combo kernels), each
kernel by name, in MODEL-inductor.json; --profile-captured: the same step also captured whole (``capture_step``) and
each kernel's device time set beside its uncaptured time, the two steps' kernels paired in launch order, in
MODEL-captured.json (the kernels the pairing finds in one step only are listed apart). Each path's bytes held from the
forward to the backward (what it saves for backward, and its outputs) are printed beside.

Writes MODEL-kernels.json, MODEL-segments.json, the traces MODEL-fw<i>.txt and MODEL-bw<i>.txt, and MODEL-report.txt
into ``$OUT`` (its results at d45984d hold the kernels of three steps by name instead: ``{name: [launches, µs]}``).
The guard decides on wall-clock timings of uncaptured regions here, so its regions may differ from those of a step
``capture_step`` captures (there it decides on device estimates).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import thunder
import torch
from thunder.dynamo import thunderfx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # step_launches, beside this script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_launches import profiled_launches

from thunder_fusion_guard import Costs, FusionGuard, Rewrites, fusion_executors, translate_library_ops
from thunder_fusion_guard import _thunder as th
from thunder_fusion_guard.bench.zoo_models import ZOO
from thunder_fusion_guard.examine.kernel_histogram import format_histograms, step_histogram
from thunder_fusion_guard.examine.segments import collect_segments
from thunder_fusion_guard.replays import warming_up_for_capture
from thunder_fusion_guard.whole_graph import COMBO_KERNELS


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp/anatomy"))
    out.mkdir(parents=True, exist_ok=True)
    translate_library_ops()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    merge = "--no-merge-regions" not in sys.argv
    matmuls, captured = "--matmuls" in sys.argv, "--captured" in sys.argv
    name = args[0] if args else "e3nn-nequip-modules"
    built = ZOO[name].build("cuda")
    model, inputs = built.module, built.inputs
    print(name, [tuple(i.shape) for i in inputs], flush=True)
    guard = FusionGuard(
        choose_executor=True,
        exact_only=False,
        rewrites=Rewrites(merge_regions=merge, small_matmuls=matmuls),
        costs=Costs(measure_budget_s=300),
    )
    compiled = thunderfx(model, executors=fusion_executors("cuda"), transforms=[guard])

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        inputs[0].grad = None
        compiled(*inputs).sum().backward()

    began = time.time()
    with warming_up_for_capture() if captured else contextlib.nullcontext():  # the guard decides when it compiles
        step()
    torch.cuda.synchronize()
    print("first", time.time() - began, flush=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print("guarded: held from forward to backward", held_mb(compiled, inputs), "MB", flush=True)
    for k, sub in enumerate(th.thunderfx_subgraphs(compiled)):
        forward, backward = thunder.last_traces(sub.jitted), thunder.last_backward_traces(sub.jitted)
        (out / f"{name}-fw{k}.txt").write_text(str(forward[-1]))
        if backward:
            (out / f"{name}-bw{k}.txt").write_text(str(backward[-1]))
    histogram = step_histogram("guarded", compiled, tuple(inputs), {})  # one step, each kernel with its region
    print(format_histograms([histogram], top=40, wide=True), flush=True)
    (out / f"{name}-kernels.json").write_text(json.dumps(histogram.to_dict()))
    found = collect_segments(compiled, *inputs)
    (out / f"{name}-segments.json").write_text(json.dumps([r.to_dict() for r in found], default=str))
    for r in found:
        d = r.details
        print(
            r.subgraph,
            r.trace,
            r.region,
            len(r.ops),
            "kernels",
            d.get("kernels"),
            "segmented",
            d.get("segmented"),
            "sched",
            d.get("schedulers"),
            flush=True,
        )
    (out / f"{name}-report.txt").write_text(guard.report.to_text(wide=True))
    if "--profile-captured" in sys.argv:
        from thunder_fusion_guard import capture_step

        uncaptured = kernel_sequence(step)
        captured = capture_step(step, grads_of=[*model.parameters(), inputs[0]])
        paired = paired_kernels(uncaptured, kernel_sequence(captured))
        (out / f"{name}-captured.json").write_text(json.dumps(paired))
        print("captured", captured.reason or "whole", {k: v for k, v in paired.items() if k != "kernels"}, flush=True)
        worse = sorted(paired["kernels"], key=lambda k: k[1] - k[2])[:25]
        for kernel, before, after in worse:
            print(f"{after:9.1f} {before:9.1f} µs captured, uncaptured  {kernel[:100]}", flush=True)
    if "--against-inductor" in sys.argv:
        found = {}
        for label, options in (("inductor", None), ("inductor/combo", COMBO_KERNELS)):
            fn = torch.compile(model, options=options)
            for _ in range(3):
                fn(*inputs).sum().backward()
            print(label, "held from forward to backward", held_mb(fn, inputs), "MB", flush=True)
            histogram = step_histogram(label, fn, tuple(inputs), {})
            print(format_histograms([histogram], top=25, wide=True), flush=True)
            found[label] = histogram.to_dict()
        (out / f"{name}-inductor.json").write_text(json.dumps(found))
    print("done", flush=True)


def kernel_sequence(step: object, steps: int = 5) -> list[tuple[str, float]]:
    """One step's CUDA launches in the order they ran (the package's ``launches``, as ``fusion-guard kernels`` reads
    them, replays of a CUDA graph too), each with its device µs averaged over ``steps`` profiled steps (the last
    step's alone where the steps launched different kernels)."""
    found = profiled_launches(step, steps)
    each = len(found) // steps
    chunks = [found[i * each : (i + 1) * each] for i in range(steps)] if each * steps == len(found) else [found]
    if len(chunks) > 1 and any([k.name for k in c] != [k.name for k in chunks[0]] for c in chunks):
        chunks = [chunks[-1]]
    return [(c[0].name, sum(k.device_us for k in c) / len(c)) for c in zip(*chunks, strict=True)]


def paired_kernels(before: list[tuple[str, float]], after: list[tuple[str, float]]) -> dict:
    """The kernels of two steps paired by name in launch order (``difflib``): ``kernels`` ``[name, µs before,
    µs after]``, the totals, and the kernels found in one step only."""
    import difflib

    matcher = difflib.SequenceMatcher(a=[n for n, _ in before], b=[n for n, _ in after], autojunk=False)
    pairs, only_before, only_after = [], [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += [
                [before[i][0], round(before[i][1], 2), round(after[j][1], 2)]
                for i, j in zip(range(i1, i2), range(j1, j2), strict=True)
            ]
        else:
            only_before += [[n, round(us, 2)] for n, us in before[i1:i2]]
            only_after += [[n, round(us, 2)] for n, us in after[j1:j2]]
    return {
        "kernels_uncaptured": len(before),
        "kernels_captured": len(after),
        "us_uncaptured": round(sum(us for _, us in before), 1),
        "us_captured": round(sum(us for _, us in after), 1),
        "paired": len(pairs),
        "kernels": pairs,
        "uncaptured_only": only_before,
        "captured_only": only_after,
    }


def held_mb(fn: object, inputs: list) -> float:
    """MB of device memory the forward of ``fn`` leaves allocated until its backward: saved tensors and outputs."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(*inputs).sum()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    out.backward()
    return round(held / 2**20, 1)


if __name__ == "__main__":
    main()
