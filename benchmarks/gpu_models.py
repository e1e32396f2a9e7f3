"""litgpt models, one forward+backward step: eager vs thunder vs guarded (and CUDA graphs), A/B interleaved.

Run on a CUDA machine from the repo root:  python3 benchmarks/gpu_models.py --json OUT.json
Setting of the issue: 2 layers, batch 1, 512 tokens, bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import thunder
import torch

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard._thunder import software_versions
from thunder_fusion_guard.regions import find_regions

MODELS = ["Mistral-7B-v0.1", "Llama-2-7b-hf", "phi-2", "pythia-1b", "gemma-2b", "Llama-3-8B", "Qwen2.5-7B"]


def build(name: str, tokens: int):
    import litgpt
    from litgpt.model import GPT

    cfg = litgpt.Config.from_name(name, n_layer=2)
    with torch.device("cuda"):
        model = GPT(cfg).to(torch.bfloat16)
    model.max_seq_length = tokens
    x = torch.randint(0, cfg.padded_vocab_size, (1, tokens), device="cuda")
    return model, x


def variants(model, with_graphs: bool):
    from thunder.transforms.cudagraph import CUDAGraphTransform

    out = {"eager": (model, None), "thunder": (thunder.jit(model), None)}
    guard = FusionGuard()
    out["guarded"] = (thunder.jit(model, transforms=[guard]), guard)
    if with_graphs:
        out["cudagraph"] = (thunder.jit(model, transforms=[CUDAGraphTransform()]), None)
        g2 = FusionGuard()
        out["guarded+cudagraph"] = (thunder.jit(model, transforms=[g2, CUDAGraphTransform()]), g2)
    return out


def step(fn, model, x):
    model.zero_grad(set_to_none=True)
    out = fn(x)
    out.float().sum().backward()
    return out.detach()


def grads_of(model) -> list:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def max_abs_diff(a: list, b: list) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def run_model(name: str, tokens: int, rounds: int, with_graphs: bool) -> dict:
    model, x = build(name, tokens)
    vs = variants(model, with_graphs)
    info: dict = {"model": name, "tokens": tokens, "variants": {}}
    reference = reference_out = None
    for label, (fn, guard) in vs.items():
        t0 = time.perf_counter()
        out = step(fn, model, x)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        grads = grads_of(model)
        entry = {"first_call_s": round(compile_s, 2)}
        if label != "eager":
            entry["fwd_regions"] = len(find_regions(thunder.last_traces(fn)[-1]))
            entry["bwd_regions"] = len(find_regions(thunder.last_backward_traces(fn)[-1]))
        if guard is not None:
            entry["decisions"] = guard.report.counts()
        if label == "thunder":
            reference, reference_out = grads, out
            # Thunder against itself: flash-attention and embedding backward accumulate with atomics, so
            # two identical steps may differ; that is the noise floor for the guarded comparison below.
            again_out = step(fn, model, x)
            again = grads_of(model)
            entry["repeat_output_equal"] = torch.equal(again_out, out)
            entry["repeat_grads_equal"] = all(torch.equal(a, b) for a, b in zip(again, grads, strict=True))
            entry["repeat_grads_max_abs_diff"] = max_abs_diff(again, grads)
        elif reference is not None and label.startswith("guarded"):
            entry["output_equal_thunder"] = torch.equal(out, reference_out)
            entry["grads_equal_thunder"] = all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
            entry["grads_max_abs_diff_thunder"] = max_abs_diff(grads, reference)
        info["variants"][label] = entry
        print(f"  {name} {label}: first call {compile_s:.1f}s", file=sys.stderr, flush=True)
    for _ in range(3):
        for fn, _g in vs.values():
            step(fn, model, x)
    samples = {k: [] for k in vs}
    for _ in range(rounds):
        for label, (fn, _g) in vs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(fn, model, x)
            torch.cuda.synchronize()
            samples[label].append((time.perf_counter() - t0) * 1e3)
    for label, s in samples.items():
        info["variants"][label]["median_ms"] = round(statistics.median(s), 3)
    th_ms = info["variants"]["thunder"]["median_ms"]
    info["guarded_over_thunder"] = round(info["variants"]["guarded"]["median_ms"] / th_ms, 3)
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", nargs="*", default=MODELS)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--graphs-for", nargs="*", default=["Mistral-7B-v0.1"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = {"device": torch.cuda.get_device_name(), "versions": software_versions(), "models": []}
    for name in args.models:
        try:
            results["models"].append(run_model(name, args.tokens, args.rounds, name in args.graphs_for))
        except Exception as e:  # one model failing must not lose the others' numbers
            results["models"].append({"model": name, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(results["models"][-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
