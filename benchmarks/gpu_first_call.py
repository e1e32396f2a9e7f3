"""First calls: the guarded first call by phase (``first_call``), torch.compile's cold compile of the same model, and
the guarded first call again in a second process on the same machine; each in a fresh process.

    source .gpu/setup.sh && python3 benchmarks/gpu_first_call.py --model small --json OUT.json

Models as ``gpu_seed_vs_inductor.py``: the two e3nn-built NequIPs under guarded ThunderFX + CUDA graphs (with
``translate_library_ops()``), the acceptance step under guarded ``thunder.jit`` + CUDA graphs. Inductor runs with
an empty cache folder of its own (cold); the two guarded processes share the guard's cache folder (the second finds
the calibration the first wrote, as a user's second process does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GUARDED = {"small": "fx-guarded+cudagraph", "e3nn-nequip-modules": "fx-guarded+cudagraph"}
GUARDED_DEFAULT = "guarded+cudagraph"  # the acceptance step, under thunder.jit
UNSHARED = '{"runtime": {"share_fusions": false}}'  # the guard options of --unshared, as JSON


def one(model: str, path: str, options: str = "{}") -> dict:
    """Build ``model``, compile it as ``path`` (guarded: with the guard options of JSON ``options``, a grouped one
    also by its name alone, ``{"share_fusions": false}``) and time its first step (a guarded path by phase), with
    how many regions ran a definition another region compiled."""
    import torch
    from gpu_seed_vs_inductor import MODELS

    from thunder_fusion_guard import first_call, translate_library_ops
    from thunder_fusion_guard.bench.zoo_paths import ZooPath
    from thunder_fusion_guard.bench.zoo_run import _compile, _Step
    from thunder_fusion_guard.options import nested

    if model != "mistral-2l":
        translate_library_ops()
    built = MODELS[model]()
    began = time.perf_counter()
    fn, guard = _compile(built.module, ZooPath.parse(path), "cuda", nested(json.loads(options)))
    step = _Step(built, fn, "cuda")
    if guard is None:
        step()
        torch.cuda.synchronize()
        return {"first_call_s": round(time.perf_counter() - began, 1)}
    with first_call(fn) as first:
        step()
    torch.cuda.synchronize()
    regions = sorted(first.regions_s.items(), key=lambda kv: -kv[1])
    return {
        "first_call_s": round(time.perf_counter() - began, 1),
        "phases_s": {k: round(v, 2) for k, v in first.phases_s.items()},
        "regions": len(regions),
        "shared_regions": len(guard.report.filter(action="share")),
        "slowest_regions_s": {k: round(v, 2) for k, v in regions[:5]},
    }


def in_a_process(model: str, path: str, env: dict[str, str], options: str = "{}") -> dict:
    """:func:`one` in a fresh Python process with ``env`` added."""
    command = [sys.executable, __file__, "--one", model, path, options]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout)[-1500:]}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small", "e3nn-nequip-modules", "mistral-2l"], action="append")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--unshared",
        action="store_true",
        help="also the guarded first call with runtime.share_fusions=False (fresh process)",
    )
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "PATH", "OPTIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)), flush=True)
        return 0
    from package_hash import resolve_commit

    from thunder_fusion_guard.bench.machine import machine_info

    record: dict = {"commit": resolve_commit(None)[0], "machine": machine_info("cuda"), "models": {}}
    for model in args.model or ["small"]:
        guarded = GUARDED.get(model, GUARDED_DEFAULT)
        with tempfile.TemporaryDirectory() as guard_cache, tempfile.TemporaryDirectory() as inductor_cache:
            shared = {"TFG_CACHE_DIR": guard_cache}
            first = in_a_process(model, guarded, shared)
            print(f"[{model}] guarded first call: {first}", flush=True)
            cold = {"TORCHINDUCTOR_CACHE_DIR": inductor_cache, "TRITON_CACHE_DIR": f"{inductor_cache}/triton"}
            inductor = in_a_process(model, "inductor-ro", cold)
            print(f"[{model}] inductor cold: {inductor}", flush=True)
            _record(record, model, guarded, first, inductor, {}, args.json)
            second = in_a_process(model, guarded, shared)
            print(f"[{model}] guarded, second process: {second}", flush=True)
            _record(record, model, guarded, first, inductor, second, args.json)
            if args.unshared:
                with tempfile.TemporaryDirectory() as own_cache:
                    unshared = in_a_process(model, guarded, {"TFG_CACHE_DIR": own_cache}, UNSHARED)
                print(f"[{model}] guarded, runtime.share_fusions=False: {unshared}", flush=True)
                _record(record, model, guarded, first, inductor, second, args.json, unshared)
    return 0


def _record(
    record: dict,
    model: str,
    guarded: str,
    first: dict,
    inductor: dict,
    second: dict,
    out: Path | None,
    unshared: dict | None = None,
) -> None:
    """The figures of ``model`` so far into ``record`` (``unshared``: the guarded first call with
    ``share_fusions=False``, where run), written to ``out`` (a run cut short keeps them)."""
    record["models"][model] = {
        "path": guarded,
        "guarded_first_call_s": first.get("first_call_s"),
        "inductor_cold_s": inductor.get("first_call_s"),
        "second_process_s": second.get("first_call_s"),
        "phases_s": first.get("phases_s"),
        "second_process_phases_s": second.get("phases_s"),
        "regions": first.get("regions"),
        "shared_regions": first.get("shared_regions"),
        "slowest_regions_s": first.get("slowest_regions_s"),
        **{k: v.get("error") for k, v in (("error", first), ("inductor_error", inductor)) if "error" in v},
    }
    if unshared is not None:
        record["models"][model]["unshared_first_call_s"] = unshared.get("first_call_s")
        record["models"][model]["unshared_phases_s"] = unshared.get("phases_s")
    if out:
        out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    sys.exit(main())
