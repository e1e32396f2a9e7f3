"""Hoisting on litgpt Mistral-7B-v0.1: one forward+backward step, variants interleaved in one process.

Run on a CUDA machine from the repo root (6-8 minutes on an H100; a variant that would start compiling
after --budget-s seconds, default 360, is skipped and named, so the run stays under 9 minutes; with
--thunder, unguarded thunder's ~150 s compile usually pushes the last variants out):

    source .gpu/setup.sh && python3 benchmarks/gpu_hoist.py            # writes $OUT/gpu_hoist.json
    source .gpu/setup.sh && python3 benchmarks/gpu_hoist.py --thunder  # also unguarded thunder (~150 s compile)

Setting of the issue: Config.from_name("Mistral-7B-v0.1", n_layer=2), batch 1, 512 tokens, bf16.
Variants: eager; guarded (defaults: hoisting on); guarded with hoist=False (the same trace, not hoisted);
the same model with cfg.sliding_window_size = None, guarded; [FusionGuard(), GuardedCUDAGraphs()] with
and without hoisting; with --thunder, unguarded thunder. Reports the median ms per step, the first call
(trace + compile) of each, the time the hoisting pass took, what was hoisted, and whether outputs and
gradients are bitwise equal to the reference: unguarded thunder with --thunder, else the guarded
hoist=False variant (the same trace minus hoisting). Eager is compared by max abs difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import thunder
import torch

import thunder_fusion_guard.passes.hoist_pass as hoist_pass
from thunder_fusion_guard import FusionGuard, GuardedCUDAGraphs
from thunder_fusion_guard._thunder import software_versions
from thunder_fusion_guard.measure.timing import interleaved_rounds
from thunder_fusion_guard.passes.hoist_runtime import hoisted_values
from thunder_fusion_guard.regions import find_regions

NAME = "Mistral-7B-v0.1"
PASS_SECONDS: list[float] = []
DEVICE = "cuda"
# --smoke: a tiny Mistral on CPU (Thunder's default executors, no CUDA graphs), to check the script itself.


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _timed_hoist(fn):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PASS_SECONDS.append(time.perf_counter() - t0)

    return timed


hoist_pass.hoist_constants = _timed_hoist(hoist_pass.hoist_constants)


def build(tokens: int, window: bool, like=None):
    import litgpt
    from gpu_models import TINY_LITGPT
    from litgpt.model import GPT

    tiny = dict(TINY_LITGPT, block_size=tokens, sliding_window_size=4) if DEVICE == "cpu" else {}
    cfg = litgpt.Config.from_name(NAME, n_layer=2, **tiny)
    if not window:
        cfg.sliding_window_size = None
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = GPT(cfg).to(torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    if like is not None:
        model.load_state_dict(like.state_dict())
    model.max_seq_length = tokens
    return model


def variants(model, model_nw, with_thunder: bool, graphs_baseline: bool) -> dict:
    """label -> (model, callable, guard), in the order they compile (the budget may cut the last ones)."""

    def guarded(m, graphs: bool = False, **options):
        guard = FusionGuard(**options)
        return m, thunder.jit(m, transforms=[guard, GuardedCUDAGraphs()] if graphs else [guard]), guard

    out = {"eager": (model, model, None), "guarded": guarded(model)}
    out["guarded hoist=False"] = guarded(model, hoist=False)
    if with_thunder:
        out["thunder"] = (model, thunder.jit(model), None)
    if DEVICE == "cuda":
        out["guarded+cudagraph"] = guarded(model, graphs=True)
    out["guarded, no window"] = guarded(model_nw)
    if graphs_baseline and DEVICE == "cuda":
        out["guarded hoist=False+cudagraph"] = guarded(model, graphs=True, hoist=False)
    return out


def step(model, fn, x):
    model.zero_grad(set_to_none=True)
    out = fn(x)
    out.float().sum().backward()
    return out.detach().clone()


def grads_of(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def max_abs_diff(a: list, b: list) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def hoist_summary(fn, guard) -> dict:
    fwd, bwd = thunder.last_traces(fn)[-1], thunder.last_backward_traces(fn)[-1]
    ours = [d for d in guard.report.decisions if d.region.startswith("hoisted_constants")]
    done = [d for d in ours if d.action == "hoist"]
    kept = [d for d in ours if d.action == "keep"]
    caches = [*hoisted_values(fwd), *(hoisted_values(bwd) if bwd is not None else [])]
    return {
        "hoisted_pieces": len(done),
        "hoisted_bytes": sum(d.details.get("bytes", 0) for d in done),
        "ops_saved_per_call": sum(d.details.get("ops_saved_per_call", 0) for d in done),
        "kept_pieces": [d.reason for d in kept],
        "caches": [{"computed": c.computed, "reused": c.reused, "outputs": len(c.outputs)} for c in caches],
        "fwd_ops": len(fwd.bound_symbols),
        "fwd_regions": len(find_regions(fwd)),
        "bwd_regions": len(find_regions(bwd)) if bwd is not None else 0,
        "decisions": guard.report.counts(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--thunder", action="store_true", help="also unguarded thunder (the bitwise reference; ~150 s)")
    p.add_argument("--no-graphs-baseline", action="store_true", help="skip guarded hoist=False + CUDA graphs")
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gpu_hoist.json"))
    p.add_argument("--smoke", action="store_true", help="a tiny model on CPU, to check this script")
    p.add_argument(
        "--budget-s", type=float, default=360, help="compile no further variant once this many seconds have passed"
    )
    args = p.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
        args.tokens = min(args.tokens, 16)
    t_start = time.perf_counter()

    if DEVICE == "cuda":  # calibrate (or find the cached constants) once, before any first call is timed
        FusionGuard().constants_for("cuda", "nvfuser")
    model = build(args.tokens, window=True)
    model_nw = build(args.tokens, window=False, like=model)
    x = torch.randint(0, model.config.padded_vocab_size, (1, args.tokens), device=DEVICE)
    vs = variants(model, model_nw, args.thunder, not args.no_graphs_baseline)
    results: dict = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
        "versions": software_versions(),
        "setting": f"{NAME}, n_layer=2, batch 1, {args.tokens} tokens, "
        f"{'bf16' if DEVICE == 'cuda' else 'fp32, tiny widths'}, forward+backward",
        "variants": {},
    }
    reference_label = "thunder" if args.thunder else "guarded hoist=False"
    firsts: dict = {}
    for label, (m, fn, guard) in list(vs.items()):
        if time.perf_counter() - t_start > args.budget_s and label not in ("eager", "guarded", reference_label):
            print(f"{label}: skipped, past --budget-s", file=sys.stderr, flush=True)
            results.setdefault("skipped", []).append(label)
            del vs[label]
            continue
        PASS_SECONDS.clear()
        sync()
        t0 = time.perf_counter()
        out = step(m, fn, x)
        sync()
        entry = {"first_call_s": round(time.perf_counter() - t0, 2)}
        if guard is not None:
            entry["hoist_pass_s"] = round(sum(PASS_SECONDS), 3)
            entry.update(hoist_summary(fn, guard))
        firsts[label] = (out, grads_of(m))
        results["variants"][label] = entry
        print(f"{label}: first call {entry['first_call_s']} s", file=sys.stderr, flush=True)

    ref_out, ref_grads = firsts[reference_label]
    for label, (out, grads) in firsts.items():
        if label in (reference_label, "guarded, no window"):
            continue
        entry = results["variants"][label]
        if label == "eager":
            entry["output_max_abs_diff_vs_" + reference_label] = float((out.float() - ref_out.float()).abs().max())
            entry["grads_max_abs_diff_vs_" + reference_label] = max_abs_diff(grads, ref_grads)
            continue
        entry["output_equal_" + reference_label] = torch.equal(out, ref_out)
        entry["grads_equal_" + reference_label] = all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))
        entry["grads_max_abs_diff_" + reference_label] = max_abs_diff(grads, ref_grads)

    # A second step of each compiled variant: the hoisted values come from the cache now.
    for label, (m, fn, guard) in vs.items():
        if guard is None:
            continue
        out, grads = step(m, fn, x), grads_of(m)
        if label != "guarded, no window":
            entry = results["variants"][label]
            entry["second_step_output_equal_" + reference_label] = torch.equal(out, ref_out)
            entry["second_step_grads_equal_" + reference_label] = all(
                torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True)
            )

    steps = {label: (lambda m=m, fn=fn: step(m, fn, x)) for label, (m, fn, _g) in vs.items()}
    timed = interleaved_rounds(steps, args.rounds, warmup=3, sync=sync)
    for label, s in timed.samples.items():
        results["variants"][label]["median_ms"] = round(statistics.median(s) * 1e3, 3)
        vs_label = vs[label]
        if vs_label[2] is not None:
            results["variants"][label]["caches_after"] = hoist_summary(vs_label[1], vs_label[2])["caches"]
    v = results["variants"]
    eager_ms = v["eager"]["median_ms"]
    results["guarded_over_eager"] = round(v["guarded"]["median_ms"] / eager_ms, 3)
    if "guarded, no window" in v:
        results["guarded_over_no_window"] = round(v["guarded"]["median_ms"] / v["guarded, no window"]["median_ms"], 3)
    results["total_s"] = round(time.perf_counter() - t_start, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)

    print(json.dumps(results, indent=1))
    print(f"\n{results['setting']} on {results['device']}; reference for equality: {reference_label}")
    print(f"{'variant':32} {'median ms':>10} {'first call s':>13} {'hoisted':>8} {'equal out/grads':>16}")
    for label, e in v.items():
        eq = ""
        if "output_equal_" + reference_label in e:
            eq = f"{e['output_equal_' + reference_label]}/{e['grads_equal_' + reference_label]}"
        hoisted = e.get("hoisted_pieces", "")
        print(f"{label:32} {e['median_ms']:>10.3f} {e['first_call_s']:>13.2f} {hoisted!s:>8} {eq:>16}")
    print(
        f"guarded/eager {results['guarded_over_eager']}, guarded/no-window {results.get('guarded_over_no_window')}, "
        f"total {results['total_s']} s, skipped {results.get('skipped', [])}"
    )


if __name__ == "__main__":
    main()
