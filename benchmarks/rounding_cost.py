"""What the rounding rule costs: low-precision element-wise regions the rule now keeps, timed
against the same guard with ``exact_only=False`` (which rejects them, as the guard did before the rule),
unguarded Thunder and eager. Interleaved rounds in one process; median µs per call and min-max.

    python3 benchmarks/rounding_cost.py --device cpu      # OMP_NUM_THREADS=1 on a shared CPU
    python3 benchmarks/rounding_cost.py --device cuda --json $OUT/rounding_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import thunder
import torch

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard.measure.timing import interleaved_rounds


def add3(a, b, c):
    return a + b + c


def cast_chain(a, b, c):
    return (a.float() * 2 + b).to(a.dtype) - c


def where_chain(a, b, c):
    return torch.where(a > b, a - c, b + c).abs()


PROGRAMS = {"add3": add3, "cast_chain": cast_chain, "where_chain": where_chain}
SIZES = {"cpu": {"small": (64,), "large": (1 << 20,)}, "cuda": {"small": (64,), "large": (1 << 24,)}}


def variants(device: str) -> dict[str, dict]:
    options = {} if device == "cuda" else {"executors": [_tc()]}
    return {
        "thunder": {**options},
        "guarded": {**options, "transforms": [FusionGuard()]},
        "guarded-before-rule": {**options, "transforms": [FusionGuard(exact_only=False)]},
    }


def _tc():
    from thunder.executors.torch_compile import torch_compile_ex

    return torch_compile_ex


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for pname, fn in PROGRAMS.items():
        for size_name, shape in SIZES[args.device].items():
            for dtype in (torch.bfloat16, torch.float32):
                gen = torch.Generator().manual_seed(0)
                inputs = [torch.randn(shape, generator=gen).to(dtype).to(args.device) for _ in range(3)]
                fns = {"eager": fn} | {v: thunder.jit(fn, **o) for v, o in variants(args.device).items()}
                for f in fns.values():
                    f(*inputs)
                ref = fns["thunder"](*inputs)
                equal = torch.equal(fns["guarded"](*inputs), ref)
                before_equal = torch.equal(fns["guarded-before-rule"](*inputs), ref)
                inner = 20 if size_name == "small" else 2
                calls = {name: (lambda f=f, xs=inputs: f(*xs)) for name, f in fns.items()}
                timed = interleaved_rounds(calls, args.rounds, inner=inner, sync=sync)
                samples = {name: [t * 1e6 for t in s] for name, s in timed.samples.items()}
                row = {
                    "program": pname,
                    "size": size_name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "guarded_equals_thunder": equal,
                    "before_rule_equals_thunder": before_equal,
                    **{f"{n}_us": statistics.median(s) for n, s in samples.items()},
                    **{f"{n}_range_us": [min(s), max(s)] for n, s in samples.items()},
                }
                rows.append(row)
                print(
                    f"{pname:12} {size_name:6} {row['dtype']:9} thunder {row['thunder_us']:9.1f}  guarded "
                    f"{row['guarded_us']:9.1f}  before-rule {row['guarded-before-rule_us']:9.1f}  eager "
                    f"{row['eager_us']:9.1f}  bitwise guarded={equal} before-rule={before_equal}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
