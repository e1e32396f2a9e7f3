"""What an alternative fusion's first-call check saw (CUDA): NequIP from its package under guarded ThunderFX with
``translate_library_ops()``, one energy-and-forces step. Where nvFuser fails a region, the guard runs it by
torch.compile and checks that region's first call against its ops one by one (``passes/rescue.py``). This keeps each
check: the region's ops as printed, its inputs, both outputs, a second torch.compile call on the same inputs, the
same region on the CPU and each output's distance from the ops run in float64. NequIP's backward region failed the
check on an H200 (13 apart), and these files are for finding out why, on any machine.

    PYTHONPATH=<nequip's site> python benchmarks/gpu_alternative_check.py --out DIR [--atoms 100] [--l-max 2]

Writes DIR/checks.txt (one block a check, each as it is made) and DIR/check-<n>.pt (``{"body", "args", "fused",
"ops"}``, on the CPU).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from thunder_fusion_guard import FusionGuard, fusion_executors, translate_library_ops  # noqa: E402
from thunder_fusion_guard.bench.zoo_potentials import nequip_potential  # noqa: E402
from thunder_fusion_guard.passes import rescue  # noqa: E402
from thunder_fusion_guard.whole_graph import _flat  # noqa: E402 - outputs' tensors in order, at any depth


def _cpu(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(_cpu(y) for y in x)
    return x


def against_float64(ops: object, fused_out: object, ops_out: object, args: tuple) -> str:
    """Each floating output's distance (relative, root-mean-square) from the ops run in float64, the fusion's beside the
    ops' own in their dtype: where the ops' own is as large, the output cancels to about zero and any other order of
    the same sums lands as far off; where only the fusion's is, the fusion computes something else."""
    try:
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        exact = _flat(ops(*wide))
    except Exception as error:  # an op of the region that takes no float64 (or mixes dtypes): said, not raised
        return f"not run in float64: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    lines = []
    for i, (f, o, e) in enumerate(zip(_flat(fused_out), _flat(ops_out), exact, strict=False)):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point() and e.numel()):
            continue
        e = e.double()
        scale = max(float(e.norm()), torch.finfo(torch.float64).tiny)
        fused_off, ops_off = (float((t.double() - e).norm()) / scale for t in (f, o))
        lines.append(f"  output {i} {tuple(e.shape)}: fusion {fused_off:.2g}, ops {ops_off:.2g} off float64's")
    return "\n".join(lines) or "  no floating output"


def _keep_checks(out: Path, log: list[str]) -> None:
    """Wrap the rescue's alternative and its first-call check so that each check is saved to ``out``."""
    bodies: list[str] = []
    alternative, checked = rescue._alternative, rescue._checked_against

    @functools.wraps(alternative)
    def remembering(trace, region, *rest, **named):
        bodies.append("\n".join(str(b) for b in region.body))
        return alternative(trace, region, *rest, **named)

    @functools.wraps(checked)
    def keeping(ops, executor, fused, args):
        n = len(log)
        copies = rescue.copied_args
        want, got, again = ops(*copies(args)), fused(*copies(args)), fused(*copies(args))
        far, repeat = rescue._how_far(got, want), rescue._how_far(again, got)
        try:  # the same region compiled again for the CPU, against its ops there
            cpu_args = _cpu(args)
            on_cpu = rescue._how_far(fused(*cpu_args), ops(*cpu_args))
        except Exception as error:  # the region may not run on the CPU at all: said, not raised
            on_cpu = f"not run on the CPU: {type(error).__name__}: {error}"
        exact = against_float64(ops, got, want, copies(args))
        body = bodies[-1] if bodies else "(not recorded)"
        torch.save({"body": body, "args": _cpu(args), "fused": _cpu(got), "ops": _cpu(want)}, out / f"check-{n}.pt")
        log.append(
            f"check {n} ({executor}): against the ops {far or 'within rounding'}; a second call against the first "
            f"{repeat or 'within rounding'}; on the CPU {on_cpu or 'within rounding'}\n{exact}\n{body}\n"
        )
        with open(out / "checks.txt", "a") as written:  # as it comes: a run stopped later keeps it
            written.write(log[-1] + "\n")
        print(log[-1].splitlines()[0], flush=True)
        return checked(ops, executor, fused, args)

    rescue._alternative, rescue._checked_against = remembering, keeping


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--atoms", type=int, default=100)
    parser.add_argument("--l-max", type=int, default=2, help="NequIP's l_max (the zoo's nequip-l3 is 3)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if not args.out.is_dir():
        parser.error(f"--out {args.out}: no such folder")
    (args.out / "checks.txt").unlink(missing_ok=True)
    log: list[str] = []
    _keep_checks(args.out, log)
    translate_library_ops()
    from thunder.dynamo import thunderfx

    built = nequip_potential(args.device, l_max=args.l_max, atoms=args.atoms)
    model, (positions, *graph) = built.module, built.inputs
    guarded = thunderfx(model, executors=fusion_executors(args.device), transforms=[FusionGuard()])
    for _ in range(2):
        energy = guarded(positions, *graph)
        torch.autograd.grad(-energy, positions)
    if not log:
        (args.out / "checks.txt").write_text("no alternative fusion was checked\n")
    print(f"{len(log)} checks written to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
