"""What CUDA graphs copy on the e3nn-built NequIP (with ``translate_library_ops()``, through ThunderFX guarded
with ``GuardedCUDAGraphs``): per captured region, its tensor inputs, how many of them are copied into the capture's
static buffers at each replay (and how many of those are parameters), and the bytes copied per training step.
Thunder's ``CUDAGraphTransform`` copies every input it does not know to stay in place; ``GuardedCUDAGraphs``'
``share_buffers`` (on by default; ``--unshared``: off) has it capture a run of consecutive ops as one graph and
read earlier graphs' outputs in place.

    source .gpu/setup.sh && python3 benchmarks/gpu_cudagraph_copies.py [--unshared]
    # prints, and writes $OUT/cudagraph-copies.txt ($OUT/cudagraph-copies-unshared.txt)
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package

from thunder.dynamo import thunderfx
from thunder.transforms.cudagraph import CUDAGraphRunner

from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs, translate_library_ops
from thunder_fusion_guard.bench.zoo_models import ZOO
from thunder_fusion_guard.bench.zoo_run import _timing_alone

# region name -> [replays, tensor inputs, inputs copied, parameters copied, bytes copied], over the counted steps
COUNTS: dict[str, list[int]] = {}
# region name -> {copied input's name in the region's trace: bytes per replay}
COPIED: dict[str, dict[str, int]] = {}
# every capture's output names, by runner: an input among them is another capture's output, copied all the same
OUTPUTS: dict[str, str] = {}
_call = CUDAGraphRunner.call_cuda_graph


def _counting_call(self: CUDAGraphRunner, fn_name: str, *args: object) -> object:
    """Thunder's replay, counting the inputs it is about to copy (those not the capture's own buffers)."""
    entry = self.cuda_graph_cache.get(self.make_cache_key(fn_name, *args))
    if entry is not None:
        row = COUNTS.setdefault(fn_name, [0, 0, 0, 0, 0])
        copied = [
            a
            for s, a in zip(entry[1], args, strict=True)
            if isinstance(a, torch.Tensor) and isinstance(s, torch.Tensor) and s is not a
        ]
        row[0] += 1
        row[1] = sum(isinstance(a, torch.Tensor) for a in args)
        row[2] = len(copied)
        row[3] = sum(isinstance(a, torch.nn.Parameter) for a in copied)
        row[4] += sum(a.numel() * a.element_size() for a in copied)
        _bsyms, inputs, outputs = self.trace_symbols[fn_name]
        for p in outputs:
            OUTPUTS.setdefault(getattr(p, "name", str(p)), fn_name)
        names = COPIED.setdefault(fn_name, {})
        for p, s, a in zip(inputs, entry[1], args, strict=True):
            if isinstance(a, torch.Tensor) and isinstance(s, torch.Tensor) and s is not a:
                names[getattr(p, "name", str(p))] = a.numel() * a.element_size()
    return _call(self, fn_name, *args)


def main(shared: bool) -> None:
    warnings.simplefilter("ignore")
    began = time.time()
    name = "cudagraph-copies.txt" if shared else "cudagraph-copies-unshared.txt"
    out_path = Path(os.environ.get("OUT", ".")) / name
    with out_path.open("w") as out:

        def say(*parts: object) -> None:
            print(*parts, flush=True)
            print(*parts, file=out, flush=True)

        translate_library_ops()
        CUDAGraphRunner.call_cuda_graph = _counting_call
        model = ZOO["e3nn-nequip-modules"].build("cuda")
        guard = FusionGuard()
        compiled = thunderfx(model.module, transforms=[guard, GuardedCUDAGraphs(share_buffers=shared)])

        def step() -> None:
            model.module.zero_grad(set_to_none=True)
            model.loss(compiled(*model.inputs)).backward()

        for _ in range(3):  # the first compiles and captures
            step()
        torch.cuda.synchronize()
        say(f"compiled and warmed up in {time.time() - began:.1f} s")
        COUNTS.clear()
        steps = 5
        with _timing_alone():  # where TFG_ZOO_LOCK names a file: not while a zoo process beside it times
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        say("region           replays/step  tensor inputs  copied  of them parameters  KiB copied/step")
        total = 0
        for name, (replays, inputs, copied, params, nbytes) in sorted(COUNTS.items()):
            total += nbytes
            kib = nbytes / steps / 1024
            say(f"{name:16} {replays / steps:12.1f}  {inputs:13}  {copied:6}  {params:18}  {kib:15.1f}")
        say(f"{len(COUNTS)} captured regions; {total / steps / 2**20:.2f} MiB copied per step")
        say("largest copied inputs (name in the region's trace, KiB, the capture whose output it is, if any):")
        biggest = sorted(((b, n, r) for r, names in COPIED.items() for n, b in names.items()), reverse=True)[:25]
        for nbytes, name, region in biggest:
            say(f"  {region:12} {name:10} {nbytes / 1024:12.1f}  {OUTPUTS.get(name, '-')}")
        for d in guard.report.filter(action="capture"):
            say(f"guard's capture decision, {d.subgraph} {d.trace}: {d.details.get('explanation', d.reason)}")


if __name__ == "__main__":
    main(shared="--unshared" not in sys.argv[1:])
