"""The two-process side of tests/test_distributed.py: each rank (gloo, CPU) trains a small model for three
steps under each distributed set-up, unguarded and guarded, and writes what it saw to a JSON file.

Set-ups: Thunder's DDP and FSDP (``thunder.distributed.ddp`` / ``fsdp``, and ``DDPTransform`` /
``FSDPTransform`` in ``transforms=``) and ThunderFX under PyTorch's DDP and FSDP2 (``fully_shard``).
The guard is ``FusionGuard(strict=True, compare_ranks=True)``, every other option at its default.

The model builds input-independent work in its forward (a position table from ``arange`` and a causal
mask from ``full(-inf)`` and ``triu``), which the guard hoists. The fusion executor is Thunder's
torch.compile executor without the collectives (with ``torch_compile_ex`` itself Thunder's DDP and FSDP
fail in thunder 0.2.6, guard or not; the worker records how) and without linear and matmul, which it
leaves to the torch executor as nvFuser does by default: so the mask and the table land in regions of
element-wise exact ops, as on the GPU, which the default ``exact_only`` lets the guard split. With
matmul inside the regions (``torch_compile_ex``'s own claim) the mask shares a region with reductions,
and nothing is hoisted: the extra case ``...+matmul-in-regions`` checks that.

Each rank finds this executor's cost constants in its own calibration cache, seeded with the shipped
CPU constants of ``torchcompile`` (what ``fusion-guard calibrate`` leaves behind): with
``calibration="auto"`` and no constants, each rank would calibrate on its own (and an executor that is not
registered with thunder cannot be calibrated: every region is then kept).
Every jit runs with Thunder's trace checking, as the rest of the suite (tests/conftest.py).
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
from thunder.core.prims import PrimIDs as Prims
from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
from thunder.extend import ImplInfo

# The package's internals used here, in one place.
from thunder_fusion_guard import Costs, FusionGuard, profile_regions
from thunder_fusion_guard.distributed import decision_key
from thunder_fusion_guard.measure.calibrate import save_constants, shipped
from thunder_fusion_guard.ops import COMMUNICATION_OPS
from thunder_fusion_guard.passes.collectives import communication_sequence

STEPS = 3
TOKENS = 4


class Net(torch.nn.Module):
    """Two linears around a causal ReLU attention. Its forward builds, from factory ops alone, a position
    table (``arange``) and a causal mask (``full(-inf)``, ``triu``): the same on every call, so hoisted.
    Defined outside torch.nn so that Dynamo compiles its forward (it skips torch.nn's own modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        position = torch.arange(t, dtype=x.dtype)[:, None] * torch.arange(1, 9, dtype=x.dtype) * 0.125
        h = self.l1(x.reshape(-1, 8) + position)
        mask = torch.full((t, t), float("-inf")).triu(1)
        attention = torch.relu(h @ h.t() * 0.25 + mask)
        return self.l2(F.gelu(h + attention @ h * 0.25) * 0.5).reshape(t, -1)


def net() -> Net:
    torch.manual_seed(0)
    return Net()


# Left to the torch executor, as nvFuser leaves them by default (nv_enable_linear / nv_enable_matmul).
MATMULS = {Prims.LINEAR, Prims.MATMUL, "torch.nn.functional.linear", "torch.matmul"}
EXECUTOR = "torchcompile_nocomm"
EXECUTOR_WITH_MATMUL = "torchcompile_nocomm_mm"


def nocomm_executor(matmul: bool = False) -> TorchCompileExecutor:
    """Thunder's torch.compile executor without the communication ops (torch_compile_ex fuses Thunder's
    collectives into its regions, and torch.compile cannot compile an async collective, thunder 0.2.6)
    and, unless ``matmul``, without linear and matmul."""
    from thunder.distributed.prims import PrimIDs

    ex = TorchCompileExecutor(name=EXECUTOR_WITH_MATMUL if matmul else EXECUTOR)
    ex._implmap = {
        op: ImplInfo()
        for op in torch_compile_ex._implmap
        if not isinstance(op, PrimIDs) and str(op) not in COMMUNICATION_OPS and (matmul or op not in MATMULS)
    }
    return ex


def seed_calibration(cache_dir: Path) -> None:
    """This rank's calibration cache, holding the shipped CPU constants of torch.compile for both
    executors: the guard's default ``calibration="auto"`` finds them there, alike on every rank."""
    os.environ["TFG_CACHE_DIR"] = str(cache_dir)
    constants = shipped("cpu", "torchcompile")
    assert constants is not None
    for name in (EXECUTOR, EXECUTOR_WITH_MATMUL):
        save_constants("cpu", name, constants)


def check_traces() -> None:
    """Thunder's trace checking on every jit, as tests/conftest.py turns it on in the test process (the
    two ranks are fresh processes): torch.compile's fusion symbols get the meta nvFuser's have."""
    import dataclasses

    from thunder.core.options import DebugOptions

    def with_meta(fuse: Any) -> Any:
        def fuse_with_meta(self: Any, region: Any, fusion_counter: int) -> Any:
            bsym = fuse(self, region, fusion_counter)
            output = bsym.output
            return bsym.from_bsym(sym=dataclasses.replace(bsym.sym, meta=lambda *args, **kwargs: output))

        return fuse_with_meta

    DebugOptions._defaults["check_traces"] = True
    TorchCompileExecutor.fuse = with_meta(TorchCompileExecutor.fuse)


def guard() -> FusionGuard:
    """The guard of every main set-up: the defaults, strict, and the ranks' decisions compared."""
    return FusionGuard(strict=True, compare_ranks=True)


# An extra case, not the defaults: a fusion call costs three eager ops and margin 0.5, so only one-op
# regions go to the torch executor. In Thunder's FSDP backward those are the gradients' pre-averaging (a
# division by the world size, exact for 2), each between two reduce-scatters: rewriting them must leave
# the collectives where they are.
ONE_OP_REGIONS = {
    "fusion_call_us": 3.0,
    "fusion_gbps": 10.0,
    "eager_op_us": 1.0,
    "eager_meta_us": 1.0,
    "eager_gbps": 10.0,
    "overlapped": False,
}


def one_op_regions_guard() -> FusionGuard:
    return FusionGuard(
        strict=True, exact_only=False, compare_ranks=True, costs=Costs(margin=0.5, calibration=ONE_OP_REGIONS)
    )


def train(fn: Any, module: torch.nn.Module, rank: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Three SGD steps on this rank's batches: each step's loss and gradients."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x, target = torch.randn(TOKENS, 8, generator=gen), torch.randn(TOKENS, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(fn(x), target)
        loss.backward()
        grads.append([p.grad.detach().clone() for p in module.parameters()])
        opt.step()
        losses.append(loss.detach().clone())
    return losses, grads


def thunder_fsdp(transforms: list, via: str, matmul: bool) -> tuple[Any, torch.nn.Module]:
    from thunder.distributed import fsdp
    from thunder.distributed.transforms.fsdp_v2 import FSDPTransform

    cpu, ex = torch.device("cpu"), nocomm_executor(matmul)
    if via == "fsdp":
        jitted = fsdp(thunder.jit(net(), executors=[ex], transforms=transforms), device=cpu)
    else:
        jitted = thunder.jit(net(), executors=[ex], transforms=[FSDPTransform(device=cpu), *transforms])
    return jitted, jitted


def thunder_ddp(transforms: list, via: str, matmul: bool) -> tuple[Any, torch.nn.Module]:
    from thunder.distributed import copy_default_process_group, ddp
    from thunder.distributed.transforms.ddp_v2 import DDPTransform

    ex = nocomm_executor(matmul)
    if via == "ddp":
        jitted = ddp(thunder.jit(net(), executors=[ex], transforms=transforms))
    else:
        ddp_transform = DDPTransform(copy_default_process_group(), bucket_size_in_mb=25.0, broadcast_from=0)
        jitted = thunder.jit(net(), executors=[ex], transforms=[ddp_transform, *transforms])
    return jitted, jitted


def thunderfx_ddp(transforms: list, _via: str, matmul: bool) -> tuple[Any, torch.nn.Module]:
    from thunder.dynamo import ThunderCompiler
    from torch.nn.parallel import DistributedDataParallel

    backend = ThunderCompiler(executors=[nocomm_executor(matmul)], transforms=transforms)
    model = DistributedDataParallel(torch.compile(net(), backend=backend))
    model._fusion_guard_backend = backend
    return model, model


def thunderfx_fsdp2(transforms: list, _via: str, matmul: bool) -> tuple[Any, torch.nn.Module]:
    from thunder.dynamo import ThunderCompiler
    from torch.distributed.fsdp import fully_shard

    model = net()
    fully_shard(model.l1)
    fully_shard(model.l2)
    fully_shard(model)
    backend = ThunderCompiler(executors=[nocomm_executor(matmul)], transforms=transforms)
    compiled = torch.compile(model, backend=backend)
    compiled._fusion_guard_backend = backend
    return compiled, model


# name -> (build, variant of Thunder's API, the guard, matmul inside torch.compile's regions)
SETUPS = {
    "thunder.distributed.ddp": (thunder_ddp, "ddp", guard, False),
    "DDPTransform": (thunder_ddp, "transform", guard, False),
    "thunder.distributed.fsdp": (thunder_fsdp, "fsdp", guard, False),
    "FSDPTransform": (thunder_fsdp, "transform", guard, False),
    "ThunderFX+DDP": (thunderfx_ddp, "", guard, False),
    "ThunderFX+FSDP2": (thunderfx_fsdp2, "", guard, False),
}
# Extra cases: what the main set-ups do not cover.
EXTRAS = {
    "thunder.distributed.ddp+matmul-in-regions": (thunder_ddp, "ddp", guard, True),
    "thunder.distributed.fsdp+matmul-in-regions": (thunder_fsdp, "fsdp", guard, True),
    "thunder.distributed.fsdp+one-op-regions": (thunder_fsdp, "fsdp", one_op_regions_guard, False),
}
ALL_SETUPS = {**SETUPS, **EXTRAS}


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
    make, via, make_guard, matmul = ALL_SETUPS[name]
    plain, plain_module = make([], via, matmul)
    losses_p, grads_p = train(plain, plain_module, rank)
    g = make_guard()
    guarded, guarded_module = make([g], via, matmul)
    losses_g, grads_g = train(guarded, guarded_module, rank)
    comms_p = [repr(communication_sequence(t)) for t in _traces(plain)]
    comms_g = [repr(communication_sequence(t)) for t in _traces(guarded)]
    profile = None
    if name == "thunder.distributed.fsdp":  # profile_regions per rank: both ranks run the program alike
        found = profile_regions(guarded, torch.randn(TOKENS, 8), reps=2, warmup=0)
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
        "hoisted": [
            {"trace": d.trace, "ops": d.ops, "split": d.details.get("split"), "applied": d.applied}
            for d in g.report.decisions
            if d.action == "hoist"
        ],
        "regions": [[d.trace, d.region, d.action, d.ops] for d in g.report.decisions if d.about_region],
        "rank_in_report": g.report.rank,
        "check_ranks": g.check_ranks(),
    }


def known_failure(name: str) -> dict[str, Any]:
    """Thunder's DDP or FSDP with ``torch_compile_ex`` ("ddp+torch_compile_ex", "fsdp+..."), without the guard
    or, with "+guard", with the main set-ups' guard: the error ('' if it ran) and the guard's decisions."""
    from thunder.distributed import ddp, fsdp

    g = guard() if name.endswith("+guard") else None
    jitted = thunder.jit(net(), executors=[torch_compile_ex], transforms=[g] if g else [])
    if name.startswith("ddp+"):
        jitted = ddp(jitted)
    else:
        jitted = fsdp(jitted, device=torch.device("cpu"))
    error = ""
    try:
        jitted(torch.randn(TOKENS, 8)).sum().backward()
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1].name
        error = f"{type(e).__module__}.{type(e).__name__} in {where}: {str(e).splitlines()[0]}"
    return {
        "error": error,
        "actions": g.report.counts() if g else None,
        "codes": [d.code for d in g.report.decisions] if g else None,
    }


def main(rank: int, world_size: int, port: int, out: str, setups: list[str], failures: list[str]) -> None:
    """One rank: every set-up in ``setups``, then the known failures; results to ``out``/rank<N>.json."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), TORCHINDUCTOR_COMPILE_THREADS="1")
    torch.set_num_threads(1)
    seed_calibration(Path(out, f"cache-rank{rank}"))
    check_traces()
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
