"""The two-process side of tests/test_distributed.py: each rank (gloo, CPU) trains a small MLP for three
steps under each distributed set-up, unguarded and guarded, and writes what it saw to a JSON file.

Set-ups: Thunder's DDP and FSDP (``thunder.distributed.ddp`` / ``fsdp``, and ``DDPTransform`` /
``FSDPTransform`` in ``transforms=``) and ThunderFX under PyTorch's DDP and FSDP2 (``fully_shard``).
Thunder's own set-ups run with Thunder's torch.compile executor minus the collectives: with
``torch_compile_ex`` itself both fail in thunder 0.2.6 without the guard, and the worker records how.
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import thunder
import torch
import torch.distributed as dist
import torch.nn.functional as F
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import ImplInfo

from thunder_fusion_guard import FusionGuard, profile_regions
from thunder_fusion_guard.distributed import decision_key
from thunder_fusion_guard.ops import COMMUNICATION_OPS
from thunder_fusion_guard.passes.collectives import communication_sequence

STEPS = 3


class MLP(torch.nn.Module):
    """Defined outside torch.nn so that Dynamo compiles its forward (it skips torch.nn's own modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x.reshape(-1, 8))
        return self.l2(F.gelu(h) * 0.5).reshape(x.shape[0], -1)


def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


def nocomm_executor() -> TorchCompileExecutor:
    """Thunder's torch.compile executor without the communication ops: torch_compile_ex fuses Thunder's
    collectives into its regions, and torch.compile cannot compile an async collective (thunder 0.2.6)."""
    from thunder.distributed.prims import PrimIDs

    ex = TorchCompileExecutor(name="torchcompile_nocomm")
    ex._implmap = {
        op: ImplInfo()
        for op in torch_compile_ex._implmap
        if not isinstance(op, PrimIDs) and str(op) not in COMMUNICATION_OPS
    }
    return ex


# A fusion call costs three eager ops and margin 0.5: only one-op regions go to the torch executor. In
# Thunder's FSDP backward those are the gradients' pre-averaging (a division by the world size, exact
# for 2), each between two reduce-scatters: rewriting them must leave the collectives where they are.
ONE_OP_REGIONS = {
    "fusion_call_us": 3.0,
    "fusion_gbps": 10.0,
    "eager_op_us": 1.0,
    "eager_meta_us": 1.0,
    "eager_gbps": 10.0,
    "overlapped": False,
}


def guard() -> FusionGuard:
    return FusionGuard(strict=True, exact_only=False, margin=0.5, calibration=ONE_OP_REGIONS, compare_ranks=True)


def train(fn: Any, module: torch.nn.Module, rank: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Three SGD steps on this rank's batches: each step's loss and gradients."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, target = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fn(x), target)
        loss.backward()
        grads.append([p.grad.detach().clone() for p in module.parameters()])
        opt.step()
        losses.append(loss.detach().clone())
    return losses, grads


def thunder_fsdp(transforms: list, via: str) -> tuple[Any, torch.nn.Module]:
    from thunder.distributed import fsdp
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    cpu = torch.device("cpu")
    if via == "fsdp":
        jitted = fsdp(thunder.jit(mlp(), executors=[nocomm_executor()], transforms=transforms), device=cpu)
    else:
        jitted = thunder.jit(mlp(), executors=[nocomm_executor()], transforms=[FSDPTransform(device=cpu), *transforms])
    return jitted, jitted


def thunder_ddp(transforms: list, via: str) -> tuple[Any, torch.nn.Module]:
    from thunder.distributed import copy_default_process_group, ddp
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    if via == "ddp":
        jitted = ddp(thunder.jit(mlp(), executors=[nocomm_executor()], transforms=transforms))
    else:
        ddp_transform = DDPTransform(copy_default_process_group(), bucket_size_in_mb=25.0, broadcast_from=0)
        jitted = thunder.jit(mlp(), executors=[nocomm_executor()], transforms=[ddp_transform, *transforms])
    return jitted, jitted


def thunderfx_ddp(transforms: list, _via: str) -> tuple[Any, torch.nn.Module]:
    from thunder.dynamo import ThunderCompiler
    from torch.nn.parallel import DistributedDataParallel

    backend = ThunderCompiler(executors=[torch_compile_ex], transforms=transforms)
    model = DistributedDataParallel(torch.compile(mlp(), backend=backend))
    model._fusion_guard_backend = backend
    return model, model


def thunderfx_fsdp2(transforms: list, _via: str) -> tuple[Any, torch.nn.Module]:
    from thunder.dynamo import ThunderCompiler
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    fully_shard(model.l1)
    fully_shard(model.l2)
    fully_shard(model)
    backend = ThunderCompiler(executors=[torch_compile_ex], transforms=transforms)
    compiled = torch.compile(model, backend=backend)
    compiled._fusion_guard_backend = backend
    return compiled, model


SETUPS = {
    "thunder.distributed.ddp": (thunder_ddp, "ddp"),
    "DDPTransform": (thunder_ddp, "transform"),
    "thunder.distributed.fsdp": (thunder_fsdp, "fsdp"),
    "FSDPTransform": (thunder_fsdp, "transform"),
    "ThunderFX+DDP": (thunderfx_ddp, ""),
    "ThunderFX+FSDP2": (thunderfx_fsdp2, ""),
}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _traces(fn: Any) -> list[thunder.core.trace.TraceCtx]:
    """The final forward and backward traces of a jitted module, or of every ThunderFX subgraph."""
    backend = getattr(fn, "_fusion_guard_backend", None)
    programs = [fn] if backend is None else [c for info in backend.subgraph_infos for c in info.thunder_compiled_fns]
    traces = []
    for program in programs:
        traces.append(thunder.last_traces(program)[-1])
        backward = thunder.last_backward_traces(program)
        if backward:
            traces.append(backward[-1])
    return traces


def run_setup(name: str, rank: int) -> dict[str, Any]:
    make, via = SETUPS[name]
    plain, plain_module = make([], via)
    losses_p, grads_p = train(plain, plain_module, rank)
    g = guard()
    guarded, guarded_module = make([g], via)
    losses_g, grads_g = train(guarded, guarded_module, rank)
    comms_p = [repr(communication_sequence(t)) for t in _traces(plain)]
    comms_g = [repr(communication_sequence(t)) for t in _traces(guarded)]
    profile = None
    if name == "thunder.distributed.fsdp":  # profile_regions per rank: both ranks run the program alike
        found = profile_regions(guarded, torch.randn(4, 8), reps=2, warmup=0)
        profile = {"rank": found.rank, "title": str(found).splitlines()[0], "rows": len(found.rows)}
    return {
        "profile": profile,
        "losses_equal": all(torch.equal(a, b) for a, b in zip(losses_g, losses_p, strict=True)),
        "grads_equal": all(
            torch.equal(_local(a), _local(b))
            for ga, gb in zip(grads_g, grads_p, strict=True)
            for a, b in zip(ga, gb, strict=True)
        ),
        "losses": [float(v) for v in losses_g],
        "collectives_guarded": comms_g,
        "collectives_unguarded": comms_p,
        "decisions": [list(map(str, decision_key(d))) for d in g.report.decisions],
        "actions": g.report.counts(),
        "rank_in_report": g.report.rank,
        "check_ranks": g.check_ranks(),
    }


def known_failure(name: str) -> str:
    """The error of Thunder's DDP or FSDP with ``torch_compile_ex``, without the guard ('' if it ran)."""
    from thunder.distributed import ddp, fsdp

    if name == "ddp+torch_compile_ex":
        jitted = ddp(thunder.jit(mlp(), executors=[torch_compile_ex]))
    else:
        jitted = fsdp(thunder.jit(mlp(), executors=[torch_compile_ex]), device=torch.device("cpu"))
    try:
        jitted(torch.randn(4, 8)).sum().backward()
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1].name
        return f"{type(e).__module__}.{type(e).__name__} in {where}: {str(e).splitlines()[0]}"
    return ""


def main(rank: int, world_size: int, port: int, out: str, setups: list[str], failures: list[str]) -> None:
    """One rank: every set-up in ``setups``, then the known failures; results to ``out``/rank<N>.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), TORCHINDUCTOR_COMPILE_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    results: dict[str, Any] = {"setups": {}, "failures": {}}
    try:
        for name in setups:
            try:
                results["setups"][name] = run_setup(name, rank)
            except Exception as e:
                results["setups"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            dist.barrier()
        for name in failures:
            results["failures"][name] = known_failure(name)
            dist.barrier()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results, indent=1))
        dist.destroy_process_group()
