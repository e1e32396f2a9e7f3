"""How much of ThunderFX's split of a NequIP or MACE Dynamo graph is Thunder's per-node support check, and how much
a memo of its verdicts by the node's op and its arguments' metadata would save, with the same verdict for every node.

ThunderFX (Thunder 0.2.6) checks each node of a Dynamo graph by running Thunder's symbol on proxies of its arguments,
with its gradient where an argument requires grad; nodes of one op on arguments alike are checked again each time.
This script captures the model's Dynamo graph(s), then runs the check on every node twice, plainly and through a memo
(a node whose key was checked before takes that verdict; a node with symbolic shapes or arguments other than tensors,
numbers and plain constants is checked plainly), timed apart, and compares the verdicts. Nothing of Thunder's changes.

    OMP_NUM_THREADS=1 python benchmarks/split_checks.py nequip --translate --json out.json
    OMP_NUM_THREADS=1 python benchmarks/split_checks.py mace --translate --json out.json  # mace-torch, e3nn 0.4.4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_potentials import potential  # noqa: E402
from package_hash import package_sha256, resolve_commit  # noqa: E402

from thunder_fusion_guard import translate_library_ops  # noqa: E402
from thunder_fusion_guard.fx_rescue import copy_input  # noqa: E402

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _meta(arg: Any) -> tuple:
    """What the check reads of one argument; ``KeyError`` where the memo should not answer for it."""
    if isinstance(arg, torch.fx.Node):
        value = arg.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            if any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride())):
                raise KeyError("symbolic shape")
            kind = (type(value).__name__, value.dtype, value.device.type, value.layout, value.requires_grad)
            return ("tensor", *kind, tuple(value.shape), value.stride())
        if isinstance(value, (int, float, bool)) and not isinstance(value, torch.SymInt):
            return ("number", type(value).__name__, value)
        raise KeyError("argument of another kind")
    if isinstance(arg, _CONSTANTS) or arg is Ellipsis:
        return ("constant", type(arg).__name__, repr(arg))
    if isinstance(arg, slice):
        return ("slice", repr(arg))
    raise KeyError("argument of another kind")


def memo_key(node: torch.fx.Node) -> tuple | None:
    """The node's op and its arguments' metadata (None where the memo does not answer for it)."""
    flat, spec = tree_flatten((node.args, node.kwargs))
    try:
        return (node.op, node.target, str(spec), tuple(_meta(a) for a in flat), torch.get_default_dtype())
    except KeyError:
        return None


def dynamo_graphs(model: torch.nn.Module, inputs: tuple) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The Dynamo graphs of one forward and backward of ``model`` on ``inputs`` (each run as Dynamo traced it), each
    with copies of the inputs Dynamo handed it (``copy_input``: the same sizes and strides, to compile it for)."""
    captured: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        captured.append((gm, [copy_input(a) for a in example_inputs]))
        return gm.forward

    torch._dynamo.reset()
    energy = torch.compile(model, backend=backend)(*inputs)
    torch.autograd.grad(energy, inputs[0])
    return captured


def checked(graphs: list[torch.fx.GraphModule], memoized: bool) -> tuple[list[bool], float, int, int]:
    """Each call node's verdict, the seconds the checks took, the nodes the memo answered and those it could not
    key (``memoized`` False: every node checked plainly)."""
    from thunder.dynamo.utils import is_node_supported_by_thunder

    verdicts, hits, unkeyed = [], 0, 0
    began = time.perf_counter()
    for gm in graphs:
        local: dict | None = {} if memoized else None  # one memo a graph, as ThunderFX splits a graph at a time
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method", "call_module"):
                continue
            key = memo_key(node) if local is not None else None
            if local is not None and key is None:
                unkeyed += 1
            if key is not None and key in local:
                hits += 1
                verdicts.append(local[key])
                continue
            ok, _ = is_node_supported_by_thunder(node, {})
            if key is not None:
                local[key] = ok
            verdicts.append(ok)
    return verdicts, time.perf_counter() - began, hits, unkeyed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=["nequip", "mace"])
    p.add_argument("--atoms", type=int, default=None, help="default: NequIP 100, MACE 30")
    p.add_argument("--l-max", type=int, default=2)
    p.add_argument("--translate", action="store_true", help="translate_library_ops() first")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    commit, package = resolve_commit(None)[0] or "", package_sha256()
    torch.set_num_threads(1)
    if args.translate:
        translate_library_ops()
    default_atoms = 100 if args.model == "nequip" else 30
    built, key = potential(args.model, args.atoms or default_atoms, args.l_max)
    graphs = [gm for gm, _ in dynamo_graphs(built.module, tuple(built.inputs))]
    rows = {}
    for run in ("plain", "memo", "plain again", "memo again"):  # interleaved: the second pair shows the spread
        verdicts, seconds, hits, unkeyed = checked(graphs, run.startswith("memo"))
        rows[run] = {"s": round(seconds, 2), "nodes": len(verdicts), "memo_answered": hits, "unkeyed": unkeyed}
        rows[run]["verdicts"] = verdicts
        print(f"{args.model} {run}: {seconds:.1f} s, {len(verdicts)} nodes, memo answered {hits}", flush=True)
    same = all(rows[r]["verdicts"] == rows["plain"]["verdicts"] for r in rows)
    row = {
        "graphs": len(graphs),
        "nodes": rows["plain"]["nodes"],
        "supported": sum(rows["plain"]["verdicts"]),
        "memo_answered": rows["memo"]["memo_answered"],
        "unkeyed": rows["memo"]["unkeyed"],
        "plain_s": [rows["plain"]["s"], rows["plain again"]["s"]],
        "memo_s": [rows["memo"]["s"], rows["memo again"]["s"]],
        "same_verdicts": same,
        "translated": args.translate,
    }
    print(f"{key}: {json.dumps(row)}", flush=True)
    out = Path(args.json)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc.update({"commit": commit, "package_sha256": package, "machine": f"CPU, 1 thread; torch {torch.__version__}"})
    doc.setdefault("models", {})[key] = row
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
