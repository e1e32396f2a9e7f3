"""Diagnostic (CUDA only): a guarded step with its nvFuser regions run as Inductor-compiled callables called
directly (no Dynamo), each compiled on the inputs it got in the step.

    python3 benchmarks/explore/inductor_direct_regions.py phi-2 train OUT   # writes OUT.json

Per region: bitwise equal to nvFuser's outputs or not, in-program host time of each call; per step: 30
interleaved rounds of both. Run once at 9895ff4 (``results/gpu-9895ff4/inductor-direct-*.json``; Llama-2's
training step failed there: a region got inputs of other strides on a later call); not part of any suite.
"""

import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import thunder
import torch
from gpu_models import Case, build, make_step
from thunder.core import prims
from thunder.core.codeutils import SigInfo
from thunder.core.trace import TraceCtx, tracectx
from thunder.executors import nvfuserex_impl as nvi
from thunder.executors.passes import transform_for_execution
from thunder.executors.torchex import ex as pytorch_ex
from torch.fx.experimental.proxy_tensor import make_fx

from thunder_fusion_guard import FusionGuard

model_name, step_kind, out = sys.argv[1], sys.argv[2], sys.argv[3]
case = Case(model_name, step_kind)
model, args, kwargs = build(case, 512, "cuda")
fn = thunder.jit(model, transforms=[FusionGuard(direct_calls=False)])
st = make_step(case, fn, model, args, kwargs, "guarded")
for _ in range(3):
    st()
torch.cuda.synchronize()

orig = nvi.FusionDefinitionWrapper.__call__
captured, repl, mode = {}, {}, {"m": "capture"}
host = {}


def patched(self, *a):
    m = mode["m"]
    if m == "capture":
        captured.setdefault(self.name.split(":")[0], a)
        return orig(self, *a)
    if m == "inductor":
        r = repl.get(self.name.split(":")[0])
        if r is not None:
            return r(*a)
    return orig(self, *a)


nvi.FusionDefinitionWrapper.__call__ = patched
st()
torch.cuda.synchronize()
mode["m"] = "orig"


def torch_callable(bsym):
    rt = TraceCtx(None)
    rt.args = list(bsym.args)
    rt.kwargs = {}
    rt.names = {a.name for a in rt.args}
    with tracectx(rt):
        for a in rt.args:
            prims.unpack_trivial(a, name=a.name)
    rt.bound_symbols += list(bsym.subsymbols)
    rt.bound_symbols.append(prims.python_return.bind(list(bsym.output), output=None))
    for b in rt.bound_symbols:
        if b.sym == prims.unpack_trivial:
            continue
        for o in b.flat_outs:
            if o is not None:
                rt.add_name(o.name)
        for s in b.subsymbols:
            for o in s.flat_outs:
                if o is not None and o.name not in rt.names:
                    rt.add_name(o.name)
    rt._siginfo = SigInfo("to_be_compiled")
    rt._siginfo.args = [(a.name, None) for a in rt.args]
    return transform_for_execution(rt, executors_list=(pytorch_ex,)).python_callable(include_decorators=False)


res = {"case": f"{model_name} {step_kind}", "regions": {}}
traces = [thunder.last_traces(fn)[-1]] + ([thunder.last_backward_traces(fn)[-1]] if step_kind == "train" else [])
t_compile = time.time()
for tr in traces:
    for b in tr.bound_symbols:
        name = b.sym.name
        if not name.startswith("nvFusion") or name not in captured:
            continue
        a = captured[name]
        info = res["regions"].setdefault(name, {})
        try:
            tc = torch_callable(b)
            with torch.no_grad():
                gm = make_fx(tc)(*a)
                comp = torch._inductor.compile(gm, list(a))
            repl[name] = comp
            info["ok"] = True
        except Exception as e:
            info["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            traceback.print_exc()
res["compile_s"] = round(time.time() - t_compile, 1)

# bitwise per region: nvFuser vs Inductor on the captured inputs
wrappers = {}


def grab(self, *a):
    wrappers.setdefault(self.name.split(":")[0], self)
    return orig(self, *a)


nvi.FusionDefinitionWrapper.__call__ = grab
st()
torch.cuda.synchronize()
nvi.FusionDefinitionWrapper.__call__ = patched
with torch.no_grad():
    for name, comp in repl.items():
        a = captured[name]
        ref = orig(wrappers[name], *a)
        got = comp(*a)
        res["regions"][name]["bitwise"] = all(torch.equal(x, y) for x, y in zip(ref, got, strict=False))
        res["regions"][name]["max_diff"] = max(
            float((x.float() - y.float()).abs().max()) for x, y in zip(ref, got, strict=False)
        )

samples = {"orig": [], "inductor": []}
outs = {}
for m in samples:
    mode["m"] = m
    outs[m] = st(keep=True)
    st()
torch.cuda.synchronize()
res["fwd_bitwise"] = bool(torch.equal(outs["orig"], outs["inductor"]))
res["fwd_max_diff"] = float((outs["orig"].float() - outs["inductor"].float()).abs().max())
for r in range(30):
    for m in ["orig", "inductor"] if r % 2 == 0 else ["inductor", "orig"]:
        mode["m"] = m
        torch.cuda.synchronize()
        t = time.perf_counter()
        st()
        h = time.perf_counter()
        torch.cuda.synchronize()
        samples[m].append(((time.perf_counter() - t) * 1e3, (h - t) * 1e3))
for m, s in samples.items():
    res[m] = {
        "median_ms": round(statistics.median(x for x, _ in s), 3),
        "host_ms": round(statistics.median(x for _, x in s), 3),
    }
# in-program host per call, each way
for m in ("orig", "inductor"):
    mode["m"] = m
    acc = {}
    inner = nvi.FusionDefinitionWrapper.__call__

    def timing(self, *a, _inner=inner, _acc=acc):
        t = time.perf_counter_ns()
        r = _inner(self, *a)
        _acc[self.name.split(":")[0]] = _acc.get(self.name.split(":")[0], 0) + time.perf_counter_ns() - t
        return r

    nvi.FusionDefinitionWrapper.__call__ = timing
    for _ in range(10):
        torch.cuda.synchronize()
        st()
    torch.cuda.synchronize()
    nvi.FusionDefinitionWrapper.__call__ = inner
    for k, v in acc.items():
        res["regions"].setdefault(k, {})[f"host_us_{m}"] = round(v / 10e3, 1)
    res[m]["fusion_host_us"] = round(sum(acc.values()) / 10e3)
with open(out + ".json", "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps({k: v for k, v in res.items() if k != "regions"}, indent=1))
