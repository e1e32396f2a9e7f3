"""One guarded ThunderFX training step of the zoo's NequIP built from e3nn's modules on CUDA: which parameters
get no gradient, and what the guard said (its `gradients lost`, `not rescued` and `rescue` decisions).

    source .gpu/setup.sh && python3 benchmarks/gpu_lost_gradients.py   # prints, and writes $OUT/probe.txt
"""

from __future__ import annotations

import os
import time
import warnings

import torch
from thunder.dynamo import thunderfx

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.bench.zoo_models import ZOO


def main() -> None:
    warnings.simplefilter("ignore")
    start = time.time()
    with open(os.path.join(os.environ.get("OUT", "."), "probe.txt"), "w") as out:

        def say(*parts: object) -> None:
            print(*parts, flush=True)
            print(*parts, file=out, flush=True)

        model = ZOO["e3nn-nequip-modules"].build("cuda")
        say("built", round(time.time() - start, 1))
        guard = FusionGuard()
        compiled = thunderfx(model.module, transforms=[guard])
        model.loss(compiled(*model.inputs)).backward()
        torch.cuda.synchronize()
        say("step", round(time.time() - start, 1))
        missing = [n for n, p in model.module.named_parameters() if p.requires_grad and p.grad is None]
        say("params without grad:", missing)
        for d in guard.report.decisions:
            if d.reason.startswith(("gradients lost", "not rescued")) or d.action == "rescue":
                say(d.subgraph, d.action, d.reason[:200], d.details.get("source"))
        say("done", round(time.time() - start, 1))


if __name__ == "__main__":
    main()
