"""The first guarded ``thunder.jit`` on a GPU with nothing cached: it calibrates by itself.

Run by ``benchmarks/gpu.sh decisions`` with ``TFG_CACHE_DIR`` pointing at an empty folder. Prints the
calibration's time and constants, the first call's time (nanoGPT block, forward and backward, bf16:
compilation, calibration and measuring included), the regions by how they were decided, and the
measuring the guard did.
"""

import logging
import os
import sys
import time
from collections import Counter

import thunder
import torch
from thunder.tests.nanogpt_model import Block, GPTConfig

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.measure.calibrate import cache_path, cached

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(name)s: %(message)s")
assert not cache_path().exists(), f"expected an empty cache in {os.environ.get('TFG_CACHE_DIR')}"
print(f"device: {torch.cuda.get_device_name()}; cache: {cache_path().parent}")


def first_call(transforms):
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=768, n_head=12, block_size=512, dropout=0.0)).to("cuda", torch.bfloat16)
    x = torch.randn(4, 512, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    jitted = thunder.jit(block, transforms=transforms)
    torch.cuda.synchronize()
    start = time.perf_counter()
    jitted(x).float().sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start, jitted


guard = FusionGuard()
guarded_s, jitted = first_call([guard])
print(f"first guarded call (compile, calibrate, measure, run), nanoGPT block fwd+bwd: {guarded_s:.1f} s")
for event in guard.report.calibrations:
    print(f"calibration: {event}")
print(f"constants: {cached('cuda', 'nvfuser')}")
print(f"measuring: {guard.report.measuring}")
print(guard.report)
regions = [d for d in guard.report if d.about_region]
print("decided by:", dict(Counter(d.details.get("decided_by") for d in regions)))
