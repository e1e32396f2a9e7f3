"""NequIP and MACE from their packages on CPU: eager against guarded ThunderFX (or ``thunder.jit``), timed interleaved
(``interleaved_rounds``) in one process, one thread. Energy and forces by backward, as a training step computes them.

    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --json out.json            # untranslated ThunderFX
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --translate --json out.json
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py mace --atoms 30 --choose --json out.json  # e3nn 0.4.4
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py mace --atoms 30 --choose --whole-graphs --json out.json
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py mace --atoms 30 --translate --phases --json out.json
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --subgraphs-untimed --json out.json  # timing's gain
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --jit --default-executors --without-exact-vjps --json x
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --translate --unguarded --json out.json  # yardstick
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py nequip --l-max 3 --json out.json  # model "nequip-l3"
    OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py mace --translate --l-max 3 --not-exact --unguarded --json x
    PYTHONHASHSEED=1 OMP_NUM_THREADS=1 python benchmarks/cpu_potentials.py mace --l-max 3 --ordered-einsum --json x

Each run adds its paths to ``--json`` (``{"commit", "models": {model: {path: {"ms", "first_call_s",
"max_abs_force_diff", ...}}}}``; the commit from ``TFG_COMMIT`` or git). ``--choose``: then ``choose_backends`` and
a second timing (each subgraph run by Thunder, Inductor or eager, the fastest by its margin; other bits than Thunder's).
MACE pins e3nn 0.4.4 and NequIP needs e3nn 0.6: run each in its own environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from package_hash import package_sha256, resolve_commit  # noqa: E402

from thunder_fusion_guard import (  # noqa: E402
    FusionGuard,
    Runtime,
    choose_backends,
    fusion_executors,
    translate_library_ops,
)
from thunder_fusion_guard.bench.zoo_potentials import mace_potential, nequip_potential  # noqa: E402
from thunder_fusion_guard.examine.first_call import first_call  # noqa: E402
from thunder_fusion_guard.measure.timing import interleaved_rounds  # noqa: E402
from thunder_fusion_guard.wording import error_line  # noqa: E402


def potential(model: str, atoms: int, l_max: int) -> tuple:
    """NequIP (``l_max``) or MACE (``max_ell``) built on CPU with ``atoms`` atoms, and its key in the results
    (the model's name, with its l if not 2)."""
    if model == "nequip":
        built = nequip_potential("cpu", atoms=atoms, l_max=l_max)
    else:
        built = mace_potential("cpu", atoms=atoms, max_ell=l_max)
    return built, model if l_max == 2 else f"{model}-l{l_max}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=["nequip", "mace"])
    p.add_argument("--atoms", type=int, default=100)
    p.add_argument(
        "--l-max", type=int, default=2, help="NequIP's l_max, MACE's max_ell (the model's key names it if not 2)"
    )
    p.add_argument("--jit", action="store_true", help="thunder.jit instead of ThunderFX")
    p.add_argument(
        "--default-executors",
        action="store_true",
        help="Thunder's default executors (no fusion on CPU) instead of torch.compile's",
    )
    p.add_argument(
        "--without-exact-vjps",
        action="store_true",
        help="also the guard with runtime.exact_vjps=False, in the same rounds (its forces compared bit for bit)",
    )
    p.add_argument("--translate", action="store_true", help="translate_library_ops() first")
    p.add_argument("--choose", action="store_true", help="choose_backends after the first call")
    p.add_argument("--whole-graphs", action="store_true", help="with --choose: choose_backends(whole_graphs=True)")
    p.add_argument("--phases", action="store_true", help="time the first call by phase (examine.first_call)")
    p.add_argument("--inductor", action="store_true", help="also torch.compile's (Inductor's) step, in the same rounds")
    p.add_argument(
        "--subgraphs-untimed",
        action="store_true",
        help="also a guarded path whose ThunderFX subgraphs are never timed against eager (in the same rounds)",
    )
    p.add_argument(
        "--unguarded",
        action="store_true",
        help="also unguarded Thunder's difference from eager (or its error), and eager's own run-to-run difference; "
        "where it runs, its step in the same rounds and whether its values equal the guarded ones bit for bit",
    )
    p.add_argument(
        "--frozen",
        action="store_true",
        help="parameters frozen (requires_grad False), as molecular dynamics runs a potential (MACE's calculator "
        "freezes them): the backward computes the forces alone (the model's key ends -frozen)",
    )
    p.add_argument(
        "--unguarded-first",
        action="store_true",
        help="with --unguarded: compile unguarded Thunder before the guarded path, so that its first call is the cold "
        "one (by default it compiles second and reads the Inductor graphs both compile from Inductor's caches)",
    )
    p.add_argument(
        "--unused-grads",
        choices=["prune", "skip", "compute"],
        default="prune",
        help="the guard's runtime.unused_grads (the model's key ends -prune or -compute where not the default)",
    )
    p.add_argument(
        "--not-exact",
        action="store_true",
        help="the guard with exact_only=False: rewrites that may round differently kept (the model's key ends "
        "-not-exact)",
    )
    p.add_argument(
        "--ordered-einsum",
        action="store_true",
        help="the guard with ordered_einsum=True: einsum traced in sorted label order, so the same program whatever "
        "PYTHONHASHSEED (the model's key ends -ordered)",
    )
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    if args.unguarded_first and not args.unguarded:
        p.error("--unguarded-first: only with --unguarded")
    commit = resolve_commit(None)[0] or ""  # the code that runs: read before the long first call
    package = package_sha256()
    torch.set_num_threads(1)
    if args.translate:
        translate_library_ops()
    built, key = potential(args.model, args.atoms, args.l_max)
    if args.frozen:
        built.module.requires_grad_(False)
        key += "-frozen"
    model, (positions, *graph) = built.module, built.inputs
    if args.unused_grads != "prune":
        key += f"-{args.unused_grads}"
    if args.not_exact:
        key += "-not-exact"
    if args.ordered_einsum:
        key += "-ordered"
    guard = FusionGuard(
        runtime=Runtime(unused_grads=args.unused_grads),
        exact_only=not args.not_exact,
        ordered_einsum=True if args.ordered_einsum else None,
    )
    executors = None if args.default_executors else fusion_executors("cpu")

    def compiled(with_guard: FusionGuard | None):
        transforms = [] if with_guard is None else [with_guard]
        if args.jit:
            import thunder

            return thunder.jit(model, executors=executors, transforms=transforms)
        from thunder.dynamo import thunderfx

        return thunderfx(model, executors=executors, transforms=transforms)

    guarded = compiled(guard)
    unexact = compiled(FusionGuard(runtime=Runtime(exact_vjps=False))) if args.without_exact_vjps else None

    def step(fn):
        energy = fn(positions, *graph)
        (forces,) = torch.autograd.grad(-energy, positions)
        return energy.detach(), forces

    def unguarded_first_call():
        """Unguarded Thunder compiled and called once: (it or None, its values or its error, seconds)."""
        began = time.perf_counter()
        try:
            fn = compiled(None)
            return fn, step(fn), round(time.perf_counter() - began, 1)
        except Exception as e:  # unguarded Thunder failing on the model is the finding
            return None, e, round(time.perf_counter() - began, 1)

    # both compile the same Inductor graphs where unguarded Thunder runs: the path compiled second reads them from
    # Inductor's caches, so its first call is not a cold one (recorded as `compiled_after`)
    early = unguarded_first_call() if args.unguarded and args.unguarded_first else None
    began = time.perf_counter()
    with first_call(guarded) if args.phases else contextlib.nullcontext() as phases:
        step(guarded)
    first_s = time.perf_counter() - began
    print(f"{args.model}: guarded first call {first_s:.1f} s", flush=True)
    if phases is not None:
        print(phases.table(width=None), flush=True)
    want = step(model)

    def off_eager(got: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
        """How far a step's forces and energy are from eager's (``want``)."""
        return {
            "max_abs_force_diff": (got[1] - want[1]).abs().max().item(),
            "energy_diff": (got[0] - want[0]).abs().item(),
        }

    rows = {}
    path = ("jit" if args.jit else "fx") + "-guarded" + ("+translated" if args.translate else "")
    path += ", Thunder's default executors" if args.default_executors else ""
    if args.unguarded:  # the difference unguarded Thunder itself has from eager: the guarded one's yardstick
        again = step(model)
        scale = {"eager_max_abs_force": want[1].abs().max().item(), "eager_energy": want[0].item()}
        rows["eager run to run"] = {
            **off_eager(again),
            **scale,
        }
        unguarded_path = path.replace("-guarded", "")
        unguarded, theirs, unguarded_s = early or unguarded_first_call()
        if unguarded is None:
            rows[unguarded_path] = {"error": error_line(theirs)[:300]}
        else:
            rows[unguarded_path] = {"first_call_s": unguarded_s, **off_eager(theirs), **scale}
            if early is None:
                rows[unguarded_path]["compiled_after"] = path
        print(f"{args.model} {unguarded_path}: {json.dumps(rows[unguarded_path])}", flush=True)
    else:
        unguarded, unguarded_path = None, ""
    inductor = None
    if unexact is not None:
        step(unexact)  # its first call, untimed
    if args.inductor:  # compiled after the guarded first call (Dynamo's caches kept: ThunderFX's graphs are in them)
        inductor = torch.compile(model)
        began = time.perf_counter()
        step(inductor)
        inductor_first_s = time.perf_counter() - began

    def timed(path: str, extra: dict, calls: str = "calls_before_rounds_s") -> None:
        # the two calls before the rounds, timed apart (``calls`` names them): before the first rounds, the second and
        # third calls, where a graph found failing at one call is checked at the next and decided at the one after
        later_s = []
        for _ in range(2):
            began = time.perf_counter()
            got = step(guarded)
            later_s.append(round(time.perf_counter() - began, 1))
        paths = {"eager": lambda: step(model), "guarded": lambda: step(guarded)}
        if inductor is not None:
            paths["inductor"] = lambda: step(inductor)
        if unexact is not None:
            paths["without exact_vjps"] = lambda: step(unexact)
        # what the guard's defaults gain on unguarded Thunder, whose bits they keep (not after choose_backends)
        with_unguarded = unguarded is not None and "+chosen" not in path
        if with_unguarded:
            paths["unguarded"] = lambda: step(unguarded)
        rounds = interleaved_rounds(paths, args.rounds)
        ms = {name: statistics.median(t) * 1e3 for name, t in rounds.samples.items()}
        if inductor is not None:
            compiled = step(inductor)
            rows["inductor"] = {
                "ms": round(ms["inductor"], 2),
                "eager_ms": round(ms["eager"], 2),
                "x_eager": round(ms["inductor"] / ms["eager"], 3),
                "first_call_s": round(inductor_first_s, 1),
                "max_abs_force_diff": (compiled[1] - want[1]).abs().max().item(),
                "rounds": args.rounds,
                "atoms": args.atoms,
            }
            print(f"{args.model} inductor: {json.dumps(rows['inductor'])}", flush=True)
        if unexact is not None:
            theirs = step(unexact)
            rows[path + " without exact_vjps"] = {
                "ms": round(ms["without exact_vjps"], 2),
                "eager_ms": round(ms["eager"], 2),
                "x_eager": round(ms["without exact_vjps"] / ms["eager"], 3),
                "bitwise_equal_to_guarded": bool(torch.equal(theirs[0], got[0]) and torch.equal(theirs[1], got[1])),
                "rounds": args.rounds,
                "atoms": args.atoms,
            }
            print(f"{args.model} without exact_vjps: {json.dumps(rows[path + ' without exact_vjps'])}", flush=True)
        if with_unguarded:
            theirs = step(unguarded)
            rows[unguarded_path].update(
                {
                    "ms": round(ms["unguarded"], 2),
                    "eager_ms": round(ms["eager"], 2),
                    "x_eager": round(ms["unguarded"] / ms["eager"], 3),
                    "guarded_x_unguarded": round(ms["guarded"] / ms["unguarded"], 3),
                    "bitwise_equal_to_guarded": bool(torch.equal(theirs[0], got[0]) and torch.equal(theirs[1], got[1])),
                    "rounds": args.rounds,
                }
            )
            print(f"{args.model} {unguarded_path}: {json.dumps(rows[unguarded_path])}", flush=True)
        rows[path] = {
            "ms": round(ms["guarded"], 2),
            "eager_ms": round(ms["eager"], 2),
            "x_eager": round(ms["guarded"] / ms["eager"], 3),
            "first_call_s": round(first_s, 1),
            **({"compiled_after": unguarded_path} if early is not None and early[0] is not None else {}),
            calls: later_s,
            **off_eager(got),
            "rescues": guard.report.counts().get("rescue", 0),
            "whole_graphs": {c: len(guard.report.filter(code=c)) for c in ("whole_graph", "whole_graph_kept")},
            # each graph run whole or kept split, and why: its timings, and the Inductor options that run it
            "whole_graph_reasons": [
                d.reason for c in ("whole_graph", "whole_graph_kept") for d in guard.report.filter(code=c)
            ],
            # the backward work left out for gradients autograd does not use (runtime.unused_grads), or why not
            "unused_grads": [
                d.reason
                for c in ("unused_grads", "unused_grads_skipped", "unused_grads_kept")
                for d in guard.report.filter(code=c)
            ],
            "rounds": args.rounds,
            "atoms": args.atoms,
            # Thunder's einsum permutes follow Python's set order, so its program and bits may follow the seed
            "python_hash_seed": os.environ.get("PYTHONHASHSEED", "random"),
            **({"first_call_phases_s": phases.to_dict(3)["phases_s"]} if phases is not None else {}),
            **extra,
        }
        print(f"{args.model} {path}: {json.dumps(rows[path])}", flush=True)

    if args.subgraphs_untimed:  # the same guard, but a fused subgraph never runs eagerly: what that timing gains
        from thunder.dynamo import thunderfx

        untimed_guard = FusionGuard()
        untimed_guard.measurer.pair = lambda compiled, eager, args: "not timed: off for this comparison"
        untimed = thunderfx(model, executors=fusion_executors("cpu"), transforms=[untimed_guard])
        step(untimed)
        rounds = interleaved_rounds(
            {"eager": lambda: step(model), "guarded": lambda: step(guarded), "untimed": lambda: step(untimed)},
            args.rounds,
        )
        ms = {name: statistics.median(t) * 1e3 for name, t in rounds.samples.items()}
        measured = [d for d in guard.report if d.code == "piece_eager" and d.details.get("decided_by") == "measured"]
        rows[path + " vs subgraphs untimed"] = {
            "x_eager": round(ms["guarded"] / ms["eager"], 3),
            "untimed_x_eager": round(ms["untimed"] / ms["eager"], 3),
            "ms": {name: round(v, 2) for name, v in ms.items()},
            "subgraphs_eager_by_timing": len(measured),
            "rounds": args.rounds,
        }
        print(f"{args.model} {path} vs subgraphs untimed: {json.dumps(rows[path + ' vs subgraphs untimed'])}")
    timed(path, {}, "calls_before_rounds_s" if args.subgraphs_untimed else "second_third_calls_s")
    if args.choose:
        began = time.perf_counter()
        choices = choose_backends(guarded, positions, *graph, guard=guard, whole_graphs=args.whole_graphs)
        chosen = dict(Counter(c.chosen for c in choices))
        print(f"{args.model}: backends chosen {chosen}", flush=True)
        name = path + ("+chosen whole graphs" if args.whole_graphs else "+chosen")
        timed(name, {"backends_chosen": chosen, "choose_s": round(time.perf_counter() - began, 1)})
    out = Path(args.json)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["commit"] = commit
    doc["package_sha256"] = package  # the package files that ran, whatever commit is named
    doc["machine"] = f"CPU, 1 thread, {os.cpu_count()} cores; torch {torch.__version__}"
    doc.setdefault("models", {}).setdefault(key, {}).update(rows)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
