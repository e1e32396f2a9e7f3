"""Diagnostic (CUDA only): cProfile of 20 guarded steps and the traces they run.

    python3 benchmarks/explore/host_profile.py Llama-2-7b-hf train OUT   # writes OUT.prof.txt, OUT.traces.py

Run once at 9895ff4 (``results/gpu-9895ff4/host-profile-*.txt``); not part of any suite.
"""

import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import thunder
import torch
from gpu_models import Case, build, make_step

from thunder_fusion_guard import FusionGuard

model_name, step_kind, out = sys.argv[1], sys.argv[2], sys.argv[3]
case = Case(model_name, step_kind)
model, args, kwargs = build(case, 512, "cuda")
fn = thunder.jit(model, transforms=[FusionGuard()])
st = make_step(case, fn, model, args, kwargs, "guarded")
for _ in range(5):
    st()
torch.cuda.synchronize()
with open(f"{out}.traces.py", "w") as f:
    f.write("# prologue\n" + str(thunder.last_prologue_traces(fn)[-1]) + "\n")
    f.write("# forward\n" + str(thunder.last_traces(fn)[-1]) + "\n")
    bw = thunder.last_backward_traces(fn)
    if bw:
        f.write("# backward\n" + str(bw[-1]) + "\n")
t = time.perf_counter()
for _ in range(20):
    st()
h = (time.perf_counter() - t) / 20
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    st()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
ps = pstats.Stats(pr, stream=s)
ps.sort_stats("tottime").print_stats(60)
ps.sort_stats("cumulative").print_stats(60)
with open(f"{out}.prof.txt", "w") as f:
    f.write(f"host per step without profiler: {h * 1e6:.0f} us\n" + s.getvalue())
