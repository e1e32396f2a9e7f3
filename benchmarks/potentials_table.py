"""The jobs of ``benchmarks/gpu_potentials.sh`` (their JSON files) as one result, ``potentials-<gpu>-<sha>.json``:
``{"commit", "machine", "note", "package_sha256", "models": {model: {path: {"ms", "kernels", "device_ms",
"first_call_s", "max_abs_force_diff", "eager_ms", "job", ...}}}}``, and a Markdown table of it. Job files that ran
different packages (their ``package_sha256``) are refused, and so is a ``--commit`` whose committed package is not the
one they ran: every row carries that checked commit (a job's own label, read from the git copy it ran in, can be stale;
where it differs it is kept as ``job_commit``).

    python3 benchmarks/potentials_table.py JOB.json... --commit SHA --json OUT.json --markdown OUT.md

A path's key is the script's (``inductor+stepgraph``: Inductor's default mode with the whole step captured by
``capture_step``), with `` untranslated`` where ``translate_library_ops()`` was left out; MACE with cuEquivariance's
kernels sits under ``mace`` as ``cueq <path>``. Each job timed its paths against its own eager (``eager_ms``);
the model's ``eager`` row is the first job's, with eager's own run-to-run force difference from the first job that
measured it (``run_to_run_job``; the table's force column for eager).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from package_hash import commit_package_sha256

# a row stopped during choose_backends: the table's cell, its error's first clause
STOPPED_CHOOSING = "not timed: the job reached its time limit during choose_backends"
NOT_TIMED = "not timed: the job reached its time limit"  # a row's cell, the first clause of its error
KEPT = (
    "ms",
    "kernels",
    "device_ms",
    "first_call_s",
    "before_choice_s",  # a guarded path stopped during choose_backends: its first call before the choice
    "first_call_phases",  # a guarded path's first call before choose_backends, by phase (examine.first_call)
    "before_choice_of",  # a row timed as its first call left the path named, before that path's choose_backends
    "choose_s",  # choose_backends' own seconds
    "timed_before_choice_s",  # the path's timing before its choice (--time-before-choice), out of its first call
    "beside",  # a row timed before a choice: what the paths timed with it measured then (timed again after)
    "backends",  # how many subgraphs each backend runs after choose_backends
    "waited_for_lock_s",  # a guarded path's wait for another job's guarded compile, left out of its first call
    "max_abs_force_diff",
    "energy_diff",
    "eager_max_abs_force",  # the scale of the force differences (eager's largest force)
    "eager_energy",
    "run_to_run_max_abs_force_diff",  # eager's row: eager's own difference between two steps
    "step_captured",
    "kernel_families",  # per kernel kind: [kernels, device ms] a step
    "kernel_device_us",  # the dearest kernels by name: [launches, device µs] a step
    "error",
)
GUARD = ("codes", "rescued")


def _first_line(error: str | None) -> str:
    """An error's first line, shortened; a subgraph rescued without an error ran eagerly from its first call."""
    return (error or "run eagerly from its first call").splitlines()[0][:160]


def _row(row: dict, job: str, eager_ms: float | None, commit: str) -> dict:
    kept = {k: row[k] for k in KEPT if k in row}
    if "codes" in row:
        kept["decisions"] = row["codes"]
        kept["rescued"] = [f"{r['where']}: {_first_line(r.get('error'))}" for r in row["rescued"]]
    if "ms" not in row and "error" not in row:
        if "choose_s" in row:  # choose_backends ended, the capture too: stopped before or during the timing
            kept["error"] = f"{NOT_TIMED} after choose_backends chose in {row['choose_s']} s"
        elif "before_choice_s" in row:  # stopped during choose_backends: the first call before it is known
            kept["error"] = f"{STOPPED_CHOOSING}, after a first call of {row['before_choice_s']} s"
        elif "max_abs_force_diff" in row or "run_to_run_max_abs_force_diff" in row:  # compared, then stopped
            kept["error"] = f"{NOT_TIMED}, its values compared"
        else:
            kept["error"] = f"{NOT_TIMED} after this path's first call"
    eager_ms = row.get("beside", {}).get("eager", {}).get("ms", eager_ms)  # timed before a choice: its eager then
    return {**kept, "eager_ms": eager_ms, "job": job, "commit": commit}


def merge(files: list[Path]) -> dict:
    """The rows of every job file, keyed by model and path (see the module's docstring)."""
    models: dict[str, dict] = {}
    machine = None
    packages = set()
    for f in files:
        doc = json.loads(f.read_text())
        machine = machine or doc.get("machine")
        packages.add(doc.get("package_sha256"))
        suffix = "" if doc.get("translated", True) else " untranslated"
        for model, rows in doc["models"].items():
            name, prefix = ("mace", "cueq ") if model == "mace-cueq" else (model, "")
            eager_ms = rows.get("eager", {}).get("ms")
            into = models.setdefault(name, {})
            for path, row in rows.items():
                key = prefix + (path if path == "eager" else path + suffix)
                if key in into:  # the first job's row stays; eager's own run-to-run difference joins it
                    spread = row.get("run_to_run_max_abs_force_diff")
                    if key == "eager" and spread is not None and "run_to_run_max_abs_force_diff" not in into[key]:
                        into[key].update(run_to_run_max_abs_force_diff=spread, run_to_run_job=f.stem)
                    continue
                into[key] = _row(row, f.stem, eager_ms, doc["commit"])
    packages.discard(None)  # job files written before their package's hash was recorded
    if len(packages) > 1:
        raise ValueError(f"the job files ran different packages: {', '.join(sorted(packages))}")
    return {"machine": machine, **({"package_sha256": packages.pop()} if packages else {}), "models": models}


def markdown(doc: dict) -> str:
    """One table, a row per model and path."""
    lines = [
        "| model | path | ms | its eager ms | kernels a step | device ms a step | first call s | max force diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []  # under the table: a row timed before a choice, with the other paths as measured beside it
    for model, rows in doc["models"].items():
        for path, r in rows.items():
            if r.get("beside"):
                said = "; ".join(
                    f"{p} {v.get('ms', '')} ms, {v.get('kernels', '')} kernels, {v.get('device_ms', '')} device ms"
                    for p, v in r["beside"].items()
                )
                notes.append(f"\n{model}, {path}: timed beside {said}.")
            # eager's: its own; a row stopped before its timing: what it compared first, if it did
            diff = r.get("max_abs_force_diff", r.get("run_to_run_max_abs_force_diff"))
            forces = "" if diff is None else f"{diff:.1e}"
            if "error" in r and "ms" not in r:  # stopped during the choice: its first call before it, so marked
                chose = f"{r['before_choice_s']} before the choice" if "before_choice_s" in r else ""
                first = r.get("first_call_s", chose)
                # a stop during the choice without its first call's clause: that first call is in its column
                cell = STOPPED_CHOOSING if r["error"].startswith(STOPPED_CHOOSING) else r["error"][:90]
                lines.append(f"| {model} | {path} | {cell} | | | | {first} | {forces} |")
                continue
            lines.append(
                f"| {model} | {path} | {r.get('ms', '')} | {r.get('eager_ms') or ''} | {r.get('kernels', '')} | "
                f"{r.get('device_ms', '')} | {r.get('first_call_s', '')} | {forces} |"
            )
    return "\n".join(lines + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jobs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--note", default="")
    p.add_argument("--commit", required=True, help="the full sha whose package every job ran (package_hash.py)")
    p.add_argument(
        "--failed", action="append", default=[], metavar="MODEL/PATH=WHY", help="a path whose process died: its row"
    )
    args = p.parse_args(argv)
    missing = [str(f) for f in args.jobs if not f.is_file()]
    if missing:
        p.error(f"no such job file: {', '.join(missing)}")
    if any("/" not in f.partition("=")[0] or "=" not in f for f in args.failed):
        p.error("--failed takes MODEL/PATH=WHY")
    try:
        doc = merge(args.jobs)
    except ValueError as e:
        p.error(str(e))
    if "package_sha256" in doc:
        try:
            committed = commit_package_sha256(args.commit)
        except subprocess.CalledProcessError:
            p.error(f"--commit {args.commit}: no such commit here, so the package the jobs ran cannot be checked")
        if committed != doc["package_sha256"]:
            p.error(
                f"--commit {args.commit[:7]}'s package is {committed[:12]}, the jobs ran {doc['package_sha256'][:12]}: "
                "give the commit whose package ran (benchmarks/package_hash.py)"
            )
    for rows in doc["models"].values():
        for row in rows.values():
            if row.get("commit") not in (None, args.commit):
                row["job_commit"] = row["commit"]
            row["commit"] = args.commit
    for failed in args.failed:
        where, _, why = failed.partition("=")
        model, _, path = where.partition("/")
        doc["models"].setdefault(model, {})[path] = {"error": why}
    out = {"commit": args.commit, "note": args.note, **doc}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
