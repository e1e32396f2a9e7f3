"""The zoo: third-party models through eager, torch.compile, ``thunder.jit`` and ThunderFX, each Thunder path
unguarded and guarded. Per model and path: does it run, is it bitwise equal to unguarded Thunder (or within
Thunder's own run-to-run difference), its step time, first-call seconds, the guard's actions and why ops sit
outside fusions.

Each model runs in a process of its own with a time limit, so that one slow compile never hides the others;
``fusion-guard bench zoo`` is the command line. Here: running the models (:func:`run_zoo`) and one model's
process (``python -m thunder_fusion_guard.bench.zoo SPEC``); the paths are in :mod:`.zoo_paths`, the records in
:mod:`.zoo_records`, one model's run in :mod:`.zoo_run`, comparing results in :mod:`.zoo_values`, the table and
JSON in :mod:`.zoo_output`, the models in :mod:`.zoo_models`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .zoo_paths import EAGER, ZooPath, path_groups
from .zoo_records import ModelResult, merge_groups
from .zoo_run import LOCK_ENV, ModelSpec, run_model
from .zoo_values import compare_with_baselines, load_values


def run_zoo(
    models: Sequence[str],
    device: str,
    paths: Sequence[ZooPath],
    rounds: int,
    time_limit_s: float,
    log: Callable[[str], None],
    threads: int = 0,
    jobs: int = 1,
    guard_options: dict[str, Any] | None = None,
    split: bool = False,
    translate: bool = False,
    apart: bool = False,
) -> list[ModelResult]:
    """Each model in a process of its own, at most ``time_limit_s`` seconds each (timing stops early enough to
    leave results); a model that times out or crashes keeps what it had written. ``threads``: torch's intra-op
    threads in each model's process (0: torch's default). ``jobs``: processes compiling side by side; each times
    alone. ``guard_options``: the FusionGuard's options on the guarded paths (default: its defaults). ``split``:
    each model's :func:`path_groups` in processes of their own (each with the time limit), merged per model.
    ``translate``: the package's translations of library ops in place in each process (``translate_library_ops``).
    ``apart``: every Thunder path in a process of its own, each guarded path compared with its twin through the
    results both processes saved (for a model whose two compiles do not fit one time limit)."""
    with tempfile.TemporaryDirectory() as folder:
        # A lock given in the environment is shared with other zoo runs on the machine (timed one at a time too).
        lock = os.environ.get(LOCK_ENV) or (str(Path(folder) / "lock") if jobs > 1 else "")
        env = {**os.environ, **({LOCK_ENV: lock} if lock else {})}

        groups = path_groups(paths, apart) if split or apart else [list(paths)]
        units = [(name, g, group) for name in models for g, group in enumerate(groups)]

        def one(item: tuple[int, tuple[str, int, list[ZooPath]]]) -> ModelResult:
            i, (name, g, group) = item
            part = f" ({','.join(p.name for p in group)})" if split or apart else ""
            log(f"zoo: [{i}/{len(units)}] {name}{part} on {device} ...")
            out = Path(folder) / f"{name}-{g}.json"
            spec = ModelSpec(
                name, device, tuple(group), rounds, time.time() + 0.8 * time_limit_s, str(out), threads,
                guard_options, translate, str(out.with_suffix(".pt")) if apart else "",
            )  # fmt: skip
            command = [sys.executable, "-m", "thunder_fusion_guard.bench.zoo", spec.to_json()]
            try:
                done = subprocess.run(command, timeout=time_limit_s, stdout=subprocess.DEVNULL, env=env)
                problem = None if done.returncode == 0 else f"the model's process exited {done.returncode}"
            except subprocess.TimeoutExpired:
                problem = f"over its time limit of {time_limit_s:.0f} s"
            result = ModelResult.from_dict(json.loads(out.read_text())) if out.exists() else ModelResult(name)
            if problem:
                result.problem = problem + part
                log(f"zoo: {name}: {problem}{part}")
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            parts = list(pool.map(one, enumerate(units, 1)))
        merged = [merge_groups(parts[i : i + len(groups)]) for i in range(0, len(parts), len(groups))]
        if apart:  # each guarded path against its twin, from the results their processes saved
            for result in merged:
                names: dict[ZooPath, list[str]] = {}
                values: dict[ZooPath, list[Any]] = {}
                for g in range(len(groups)):
                    got_names, got = load_values(Path(folder) / f"{result.model}-{g}.pt")
                    names.update((p, n) for p, n in got_names.items() if p != EAGER)
                    values.update((p, v) for p, v in got.items() if p != EAGER)
                compare_with_baselines(result, names, values)
        return merged


def _main(argv: Sequence[str]) -> int:
    """One model, in its own process: ``python -m thunder_fusion_guard.bench.zoo SPEC`` (a :class:`ModelSpec` as
    JSON)."""
    (spec,) = argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_model(ModelSpec.from_json(spec), _stderr)
    return 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
