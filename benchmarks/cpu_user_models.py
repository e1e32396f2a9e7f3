"""Three models nobody in this repository wrote, each a CPU training step, under eager, unguarded and guarded Thunder.

Whether the guard decides right on a user's own model on CPU: a diffusion-style U-Net (GroupNorm, SiLU, a
sinusoidal time embedding, skip connections; Thunder on CPU is slower than eager there), a GPT-style model from
Hugging Face's ``GPTBigCodeForCausalLM`` (tiny config, random weights) and a conv + GRU audio model (also under
ThunderFX, where ``thunder.jit`` fails on ``nn.GRU``). For each: the first call's seconds, the step time of every
path interleaved (``interleaved_rounds``: median, min, max, rounds), whether guarded outputs and gradients are
bitwise unguarded Thunder's (else the largest difference, next to unguarded Thunder's own run-to-run difference),
the guard's decisions and whether it calibrated. Then ``fusion-guard bench decisions --quick``.

Each model runs in a process of its own under a time cap (``--model-s``), with one intra-op thread, the package's
cache in a fresh folder by default (so the first guarded compile calibrates on this CPU; ``--cache-dir`` to reuse
one) and Inductor's cache in a fresh folder too.

    PYTHONPATH=. python benchmarks/cpu_user_models.py --json benchmarks/results/cpu-user-models-SHA.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

MODELS = ("unet", "gpt_bigcode", "conv_gru")
# Models also run under ThunderFX: plain thunder.jit fails on both (GPTBigCode in Thunder's interpreter, nn.GRU).
THUNDERFX_MODELS = ("gpt_bigcode", "conv_gru")


# ---------------------------------------------------------------- models (built in the child process only)


def build_unet(torch: Any) -> tuple[Any, tuple]:
    nn = torch.nn
    F = torch.nn.functional

    class TimeEmbedding(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.dim = dim
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, 4 * dim))

        def forward(self, t):
            half = self.dim // 2
            freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
            args = t.float()[:, None] * freqs[None, :]
            return self.mlp(torch.cat([torch.sin(args), torch.cos(args)], dim=-1))

    class ResBlock(nn.Module):
        def __init__(self, cin: int, cout: int, tdim: int) -> None:
            super().__init__()
            self.norm1 = nn.GroupNorm(8, cin)
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.temb = nn.Linear(tdim, cout)
            self.norm2 = nn.GroupNorm(8, cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, temb):
            h = self.conv1(F.silu(self.norm1(x)))
            h = h + self.temb(F.silu(temb))[:, :, None, None]
            h = self.conv2(F.silu(self.norm2(h)))
            return h + self.skip(x)

    class UNet(nn.Module):
        def __init__(self, ch: int = 32, tdim: int = 32) -> None:
            super().__init__()
            self.time = TimeEmbedding(tdim)
            t4 = 4 * tdim
            self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
            self.down1 = ResBlock(ch, ch, t4)
            self.pool1 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
            self.down2 = ResBlock(ch, 2 * ch, t4)
            self.pool2 = nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1)
            self.mid = ResBlock(2 * ch, 2 * ch, t4)
            self.up2 = ResBlock(4 * ch, 2 * ch, t4)
            self.up1 = ResBlock(3 * ch, ch, t4)
            self.norm_out = nn.GroupNorm(8, ch)
            self.conv_out = nn.Conv2d(ch, 3, 3, padding=1)

        def forward(self, x_noisy, t, noise):
            temb = self.time(t)
            h0 = self.conv_in(x_noisy)
            h1 = self.down1(h0, temb)
            h2 = self.down2(self.pool1(h1), temb)
            h = self.mid(self.pool2(h2), temb)
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = self.up2(torch.cat([h, h2], dim=1), temb)
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = self.up1(torch.cat([h, h1], dim=1), temb)
            pred = self.conv_out(F.silu(self.norm_out(h)))
            return F.mse_loss(pred, noise)

    model = UNet()
    x = torch.randn(4, 3, 32, 32)
    t = torch.randint(0, 1000, (4,))
    noise = torch.randn(4, 3, 32, 32)
    return model, (x + noise, t, noise)


def build_gpt_bigcode(torch: Any) -> tuple[Any, tuple]:
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    config = GPTBigCodeConfig(
        vocab_size=512,
        n_positions=128,
        n_embd=128,
        n_layer=2,
        n_head=4,
        multi_query=True,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )

    class CausalLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = GPTBigCodeForCausalLM(config)

        def forward(self, input_ids, labels):
            return self.lm(input_ids=input_ids, labels=labels, use_cache=False).loss

    model = CausalLM()
    ids = torch.randint(0, config.vocab_size, (4, 64))
    return model, (ids, ids.clone())


def build_conv_gru(torch: Any) -> tuple[Any, tuple]:
    nn = torch.nn
    F = torch.nn.functional

    class ConvGRU(nn.Module):
        """Frame classifier on log-mel features: Conv1d front end, a GRU, a linear head, cross-entropy."""

        def __init__(self, mels: int = 40, ch: int = 64, hidden: int = 96, classes: int = 32) -> None:
            super().__init__()
            self.conv1 = nn.Conv1d(mels, ch, 5, padding=2)
            self.bn1 = nn.BatchNorm1d(ch)
            self.conv2 = nn.Conv1d(ch, ch, 3, stride=2, padding=1)
            self.gru = nn.GRU(ch, hidden, batch_first=True)
            self.head = nn.Linear(hidden, classes)

        def forward(self, feats, targets):
            h = F.gelu(self.bn1(self.conv1(feats)))
            h = F.gelu(self.conv2(h)).transpose(1, 2)
            out, _ = self.gru(h)
            logits = self.head(out)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    model = ConvGRU()
    feats = torch.randn(8, 40, 100)
    targets = torch.randint(0, 32, (8, 50))
    return model, (feats, targets)


BUILDERS = {"unet": build_unet, "gpt_bigcode": build_gpt_bigcode, "conv_gru": build_conv_gru}


# ---------------------------------------------------------------- one model, in its own process


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 600 else text[:600] + " ..."


def _diff(a: list, b: list) -> dict[str, Any]:
    """Bitwise equality of two lists of tensors (loss, then gradients) and the largest absolute difference."""
    import torch

    equal = len(a) == len(b) and all(
        x is not None and y is not None and torch.equal(x, y) for x, y in zip(a, b, strict=False)
    )
    worst = 0.0
    missing = 0
    for x, y in zip(a, b, strict=False):
        if x is None or y is None:
            missing += int((x is None) != (y is None))
            continue
        worst = max(worst, float((x.double() - y.double()).abs().max()))
    return {"bitwise": equal, "max_abs_diff": worst, "missing_grads": missing}


def run_one(
    name: str,
    out: Path,
    rounds: int,
    timing_s: float,
    profile_reps: int,
    inexact: bool = False,
    guarded_first: bool = False,
) -> None:
    """Compile, check and time one model; writes ``out`` after every phase, so a killed run leaves what it did."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import thunder_fusion_guard as tfg  # before thunder: its import notices go to the package's logger

    package = tfg.__file__
    import thunder
    import torch
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard, explain, fusion_executors, profile_regions
    from thunder_fusion_guard.measure import cache as tfg_cache
    from thunder_fusion_guard.measure.timing import interleaved_rounds

    torch.set_num_threads(1)
    result: dict[str, Any] = {"model": name, "package": package, "cpu": tfg_cache.cpu_identity(), "paths": {}}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    def say(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)

    torch.manual_seed(0)
    model, inputs = BUILDERS[name](torch)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    result["parameters"] = sum(p.numel() for p in params)
    result["inputs"] = [f"{tuple(x.shape)} {x.dtype}" for x in inputs]

    def make_step(fn):
        def step():
            for p in params:
                p.grad = None
            loss = fn(*inputs)
            loss.backward()
            return loss

        return step

    def outputs(step) -> list:
        loss = step()
        return [loss.detach().clone()] + [None if p.grad is None else p.grad.detach().clone() for p in params]

    ex = fusion_executors("cpu")
    guards: dict[str, Any] = {}
    compiled: dict[str, Any] = {"eager": model}
    variants = ("jit", "jit_guarded") + (("jit_guarded_inexact",) if inexact else ())
    variants += ("fx", "fx_guarded") + (("fx_guarded_inexact",) if inexact else ()) if name in THUNDERFX_MODELS else ()
    if guarded_first:  # each guarded path compiles before its unguarded twin (Inductor's caches then favour the twin)
        variants = tuple(sorted(variants, key=lambda v: (v.split("_")[0] != "jit", "guarded" not in v)))
    result["compile_order"] = list(variants)
    for path in variants:
        # *_inexact: FusionGuard(exact_only=False), not a default: may reject regions whose bits then change.
        guard = None if "guarded" not in path else FusionGuard(exact_only=False) if "inexact" in path else FusionGuard()
        transforms = [guard] if guard is not None else []
        if path.startswith("jit"):
            compiled[path] = thunder.jit(model, executors=ex, transforms=transforms)
        else:
            compiled[path] = thunderfx(model, executors=ex, transforms=transforms)
        if guard is not None:
            guards[path] = guard

    steps: dict[str, Any] = {}
    reference: dict[str, list] = {}
    for path, fn in compiled.items():
        say(f"{path}: first call ...")
        step = make_step(fn)
        start = time.perf_counter()
        entry: dict[str, Any] = {}
        try:
            reference[path] = outputs(step)
            entry["first_call_s"] = round(time.perf_counter() - start, 2)
            entry["loss"] = float(reference[path][0])
            steps[path] = step
            say(f"{path}: first call {entry['first_call_s']} s, loss {entry['loss']:.6f}")
        except Exception as e:  # the model fails on this path: say so, keep going
            entry["first_call_s"] = round(time.perf_counter() - start, 2)
            entry["error"] = _error(e)
            entry["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
            say(f"{path}: FAILED after {entry['first_call_s']} s: {entry['error'][:200]}")
        result["paths"][path] = entry
        save()

    # Correctness: each compiled path again (run to run), guarded against its unguarded twin, all against eager.
    for path in steps:
        again = outputs(steps[path])
        result["paths"][path]["run_to_run"] = _diff(reference[path], again)
        if path != "eager" and "eager" in reference:
            result["paths"][path]["vs_eager"] = _diff(reference["eager"], reference[path])
    twins = (("jit_guarded", "jit"), ("fx_guarded", "fx"), ("jit_guarded_inexact", "jit"), ("fx_guarded_inexact", "fx"))
    for guarded, twin in twins:
        if guarded in reference and twin in reference:
            result["paths"][guarded]["vs_unguarded"] = _diff(reference[twin], reference[guarded])
    save()

    # The guard's decisions.
    for path, guard in guards.items():
        entry = result["paths"][path]
        decisions = list(guard.report.decisions)
        entry["decisions_by_action"] = dict(Counter(d.action for d in decisions))
        entry["decided_by"] = dict(Counter(f"{d.action}/{(d.details or {}).get('decided_by', '-')}" for d in decisions))
        entry["rejects"] = [
            {"region": d.region, "name": d.to_dict().get("name"), "reason": d.reason}
            for d in decisions
            if d.action == "reject"
        ]
        entry["measured"] = [
            {
                "region": d.region,
                "action": d.action,
                "fused_us": d.details.get("measured_region_us"),
                "eager_us": d.details.get("measured_eager_us"),
                "reason": d.reason,
            }
            for d in decisions
            if d.details and d.details.get("measured_region_us") is not None
        ]
        entry["calibrations"] = list(guard.report.calibrations)
        entry["report"] = guard.report.to_dict()
        try:
            entry["explain"] = explain(compiled[path])
        except Exception as e:
            entry["explain"] = f"explain failed: {_error(e)}"
        say(f"{path}: decisions {entry['decisions_by_action']}; calibrations {entry['calibrations']}")
    save()

    # Each guarded region's fusion call against its eager lowering on its real inputs: which regions lose to eager.
    for path in guards:
        if path not in steps or profile_reps <= 0:
            continue
        say(f"{path}: profile_regions ...")
        start = time.perf_counter()
        try:
            prof = profile_regions(compiled[path], *inputs, reps=profile_reps, warmup=3)
            result["paths"][path]["profile"] = [
                {
                    "trace": r.trace,
                    "region": r.region,
                    "subgraph": r.subgraph,
                    "n_ops": r.n_ops,
                    "action": r.action,
                    "fused_us": r.host_us,
                    "fused_q1_q3": r.host_spread_us,
                    "eager_us": r.eager_us,
                    "eager_q1_q3": r.eager_spread_us,
                    "est": r.estimates,
                    "error": r.error,
                    "source": r.source,
                }
                for r in prof.rows
            ]
        except Exception as e:
            result["paths"][path]["profile_error"] = _error(e)
        result["paths"][path]["profile_s"] = round(time.perf_counter() - start, 1)
        for r in result["paths"][path].get("profile", []):
            say(f"  {r['trace']} {r['region']} {r['action']}: fused {r['fused_us']} µs, eager {r['eager_us']} µs")
        save()

    # Step time, interleaved.
    if steps:
        say(f"timing {list(steps)} interleaved, up to {rounds} rounds or {timing_s:.0f} s ...")
        deadline = time.perf_counter() + timing_s
        timed = interleaved_rounds(
            steps, rounds, warmup=2, stop=lambda r: r >= 7 and time.perf_counter() > deadline, clock=time.perf_counter
        )
        for path, samples in timed.samples.items():
            ms = [s * 1e3 for s in samples]
            result["paths"][path]["step_ms"] = {
                "median": round(statistics.median(ms), 3),
                "min": round(min(ms), 3),
                "max": round(max(ms), 3),
                "rounds": len(ms),
            }
        eager = result["paths"]["eager"].get("step_ms", {}).get("median")
        for path in steps:
            med = result["paths"][path]["step_ms"]["median"]
            if eager:
                result["paths"][path]["step_ms"]["vs_eager"] = round(med / eager, 3)
        for guarded, twin in twins:
            if guarded in steps and twin in steps:
                g, u = (result["paths"][p]["step_ms"]["median"] for p in (guarded, twin))
                result["paths"][guarded]["step_ms"]["vs_unguarded"] = round(g / u, 3)
        say("step ms: " + ", ".join(f"{p} {result['paths'][p]['step_ms']['median']}" for p in steps))
    result["done"] = True
    save()


# ---------------------------------------------------------------- the driver


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(summary: dict[str, Any]) -> dict[str, Any]:
    """What the acceptance check reads off the results: per guarded path, the regions its profile shows slower
    fused than their eager lowering (by more than 5%) and what the guard did with them, the estimate/measured
    ratios of every profiled region, and the step time against unguarded Thunder and eager."""
    out: dict[str, Any] = {}
    all_fused: list[float] = []
    all_eager: list[float] = []
    for name, res in summary.get("models", {}).items():
        for path, entry in res.get("paths", {}).items():
            if "guarded" not in path or "profile" not in entry:
                continue
            decisions = {(d.get("subgraph"), d.get("region")): d for d in entry.get("report", {}).get("decisions", [])}
            losing, ratios = [], []
            for r in entry["profile"]:
                fused, eager, est = r.get("fused_us"), r.get("eager_us"), r.get("est") or {}
                if not fused or not eager:
                    continue
                d = decisions.get((r.get("subgraph"), r.get("region")), {})
                if fused > 1.05 * eager:
                    losing.append(
                        {
                            "region": f"{r.get('subgraph') or ''} {r['trace']} {r['region']}".strip(),
                            "fused_us": round(fused, 1),
                            "eager_us": round(eager, 1),
                            "action": r.get("action"),
                            "decided_by": (d.get("details") or {}).get("decided_by"),
                            "reason": d.get("reason"),
                        }
                    )
                if est.get("est_region_us") and est.get("est_eager_us"):
                    ratios.append((est["est_region_us"] / fused, est["est_eager_us"] / eager))
            fused_r, eager_r = [a for a, _ in ratios], [b for _, b in ratios]
            if "exact_only" not in path and "inexact" not in path:
                all_fused += fused_r
                all_eager += eager_r
            step = entry.get("step_ms", {})
            out[f"{name}/{path}"] = {
                "regions_profiled": len(entry["profile"]),
                "regions_slower_fused": losing,
                "slower_fused_kept": sum(1 for x in losing if x["action"] == "keep"),
                "est_over_measured_fused": [round(x, 3) for x in fused_r],
                "est_over_measured_eager": [round(x, 3) for x in eager_r],
                "median_est_over_measured": {"fused": _median(fused_r), "eager": _median(eager_r)},
                "vs_unguarded": step.get("vs_unguarded"),
                "vs_eager": step.get("vs_eager"),
                "bitwise_vs_unguarded": (entry.get("vs_unguarded") or {}).get("bitwise"),
            }
    out["all_default_guarded_regions"] = {
        "regions": len(all_fused),
        "median_est_over_measured": {"fused": _median(all_fused), "eager": _median(all_eager)},
    }
    return out


def run_bench_decisions(env: dict[str, str], cap_s: float, workdir: Path) -> dict[str, Any]:
    out = workdir / "bench-decisions.json"
    cmd = [sys.executable, "-m", "thunder_fusion_guard", "bench", "decisions", "--quick", "--device", "cpu"]
    cmd += ["--json", str(out)]
    print(f"[bench decisions] {' '.join(cmd[1:])} ...", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=cap_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {cap_s:.0f} s"}
    took = round(time.perf_counter() - start, 1)
    print(proc.stdout, flush=True)
    result: dict[str, Any] = {"seconds": took, "returncode": proc.returncode, "stdout": proc.stdout}
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-2000:]
    if out.exists():
        result["json"] = json.loads(out.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--json", metavar="OUT", type=Path, help="write every result here")
    parser.add_argument("--model-s", type=float, default=720.0, help="time cap of each model's process (s)")
    parser.add_argument("--timing-s", type=float, default=45.0, help="seconds of interleaved rounds per model")
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds per model at most")
    parser.add_argument("--profile-reps", type=int, default=20, help="profile_regions reps per region (0: skip)")
    parser.add_argument("--inexact", action="store_true", help="also FusionGuard(exact_only=False), not a default")
    parser.add_argument("--guarded-first", action="store_true", help="compile each guarded path before its twin")
    parser.add_argument("--cache-dir", help="the package's cache (TFG_CACHE_DIR); default: a fresh folder")
    parser.add_argument("--no-bench", action="store_true", help="skip `bench decisions --quick`")
    parser.add_argument("--summarize", type=Path, metavar="RESULT", help="recompute the summary of a result file")
    parser.add_argument("--one", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args.out, args.rounds, args.timing_s, args.profile_reps, args.inexact, args.guarded_first)
        return 0
    if args.summarize:
        summary = json.loads(args.summarize.read_text())
        summary["summary"] = summarize(summary)
        args.summarize.write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(json.dumps(summary["summary"], indent=1))
        return 0
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: folder {args.json.parent} does not exist")

    workdir = Path(tempfile.mkdtemp(prefix="tfg-user-models-"))
    cache_dir = Path(args.cache_dir) if args.cache_dir else workdir / "tfg-cache"
    env = dict(os.environ, OMP_NUM_THREADS="1", TFG_CACHE_DIR=str(cache_dir), TFG_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    summary: dict[str, Any] = {
        "commit": head.stdout.strip(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {
            **{k: str(v) for k, v in vars(args).items() if k not in ("one", "out")},
            "cache_dir": str(cache_dir),
        },
        "load_average_before": os.getloadavg(),
        "models": {},
    }

    def write() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(summary, indent=1, default=str) + "\n")

    for name in args.models:
        out = workdir / f"{name}.json"
        menv = dict(env, TORCHINDUCTOR_CACHE_DIR=str(workdir / f"inductor-{name}"))
        cmd = [sys.executable, __file__, "--one", name, "--out", str(out)]
        cmd += [
            "--rounds",
            str(args.rounds),
            "--timing-s",
            str(args.timing_s),
            "--profile-reps",
            str(args.profile_reps),
        ]
        cmd += ["--inexact"] if args.inexact else []
        cmd += ["--guarded-first"] if args.guarded_first else []
        print(f"== {name} (cap {args.model_s:.0f} s)", flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=menv, timeout=args.model_s, stderr=subprocess.PIPE, text=True)
            rc, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, stderr = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        res = json.loads(out.read_text()) if out.exists() else {"model": name}
        res["process"] = {"returncode": rc, "seconds": round(time.perf_counter() - start, 1)}
        if rc != 0:
            res["process"]["stderr_tail"] = stderr[-3000:]
            print(f"[{name}] process ended: {rc}", flush=True)
        summary["models"][name] = res
        write()
    calibration = cache_dir / "calibration.json"
    summary["calibration_cache"] = json.loads(calibration.read_text()) if calibration.exists() else None
    if not args.no_bench:
        summary["bench_decisions_quick"] = run_bench_decisions(env, args.model_s, workdir)
    summary["load_average_after"] = os.getloadavg()
    summary["summary"] = summarize(summary)
    write()
    print(f"results in {args.json}" if args.json else json.dumps(summary, indent=1, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
