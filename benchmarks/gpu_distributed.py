"""litgpt, an e3nn-built NequIP and NequIP from its package on several GPUs: eager vs thunder vs guarded (each also
with CUDA graphs) under Thunder's FSDP / DDP and ThunderFX under PyTorch's DDP / FSDP2, per rank.

Run from the repo root on a machine with several GPUs, after ``source .gpu/setup.sh``; each invocation under
10 minutes (``timeout``; the JSON and Markdown are rewritten after every set-up, so a cut run keeps what it
finished). Set-ups run side by side as separate jobs (another ``--master-port`` each; with
``TFG_ZOO_LOCK=<file>``, one job times at a time), then merge:

    export TFG_ZOO_LOCK=/tmp/tfg-distributed.lock
    timeout 575 torchrun --nproc-per-node 4 --master-port 29501 benchmarks/gpu_distributed.py \
        --models mistral --layers 3 --setups fsdp --budget-s 540 &
    timeout 575 torchrun --nproc-per-node 4 --master-port 29502 benchmarks/gpu_distributed.py \
        --models mistral --layers 3 --setups ddp --variants thunder+cg guarded+cg --budget-s 540 &
    timeout 575 torchrun --nproc-per-node 4 --master-port 29503 benchmarks/gpu_distributed.py \
        --models e3nn --setups fx-ddp --budget-s 540 &
    wait; python3 benchmarks/gpu_distributed.py --merge $OUT/gpu-distributed-*.json --out distributed.json

Setting: litgpt Mistral-7B-v0.1 / Llama-2-7b-hf at ``--layers`` layers (2), batch 1 per rank, 512 tokens, bf16,
one training step (forward, cross-entropy, backward); ``e3nn``: the zoo's ``e3nn-nequip-modules`` (fp32, the
energy and its gradients, SGD steps of 1e-6, ``translate_library_ops()``), ThunderFX set-ups only; ``nequip``: the
same for ``nequip`` 0.19's NequIP (the zoo's ``nequip``: 3 layers, l_max 2, 32 features, 100 atoms), where installed.
Set-ups (``--setups``):

- ``fsdp``: eager = PyTorch FSDP2 (``fully_shard`` per block and the root); thunder =
  ``thunder.distributed.fsdp(thunder.jit(model))``; guarded = the same with the guard.
- ``ddp``: eager = PyTorch ``DistributedDataParallel``; thunder = ``thunder.distributed.ddp(thunder.jit(model))``
  (with nvFuser each gradient is all-reduced on its own: no buckets); guarded = the same with the guard.
- ``fx-ddp`` / ``fx-fsdp2``: ThunderFX (``torch.compile`` with Thunder's backend) under PyTorch's DDP /
  FSDP2, with and without the guard (eager: the same wrapper without compiling).

Variants (``--variants``): ``eager``, ``thunder``, ``guarded``, and ``thunder+cg`` / ``guarded+cg`` with CUDA graphs
(Thunder's ``CUDAGraphTransform``; guarded, ``GuardedCUDAGraphs`` after the guard; a variant Thunder cannot run
records its error), ``guarded+cgcopy`` with ``GuardedCUDAGraphs(share_buffers=False)``, ``guarded+cgkeep`` with no
gradient handed over on a graph's buffer (a diagnosis: where a + graphs difference lies). The guard is
``FusionGuard(compare_ranks=True)``, every other option at its default. For each set-up: first a correctness
phase (each variant trains 3 SGD steps from the same weights on the same batches; each guarded variant against
its unguarded twin, ``guarded+cg`` also against ``thunder`` and ``guarded``, as CUDA graphs change no value and
Thunder's own capture fails on some set-ups: losses to the bit, gradients' max abs difference at the first step
and over all three), then
the twin's own run-to-run difference, the noise floor: it takes four identical steps (same weights, same batch) and
the largest difference of the later three's gradients from the first's; the guarded gradients are "within the floor"
when their first-step difference is at most that. Then the timing phase: ``--rounds`` steps of each variant
interleaved, median ms per rank (the note names each CUDA-graph fallback the guard recorded). Every rank must run
the same variants in the same order (each step has collectives), so a set-up that no longer fits ``--budget-s``
(counted once torch and thunder are imported) is skipped on all ranks (rank 0 decides). Decisions: each rank's
decision keys are gathered and compared (and ``guard.check_ranks()`` run), hoist decisions counted; the collectives
of the final traces compared with the twin's, in order. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

Writes ``$OUT/gpu-distributed-<models>-<setups>-<variants>.json`` and ``.md`` (rank 0; every rank's numbers
gathered) and prints the table last. ``--cpu-smoke`` runs the same code on CPU (gloo, tiny configs, the
torch.compile executor without collectives, linear and matmul, as nvFuser leaves them) to check it:

    torchrun --nproc-per-node 2 benchmarks/gpu_distributed.py --cpu-smoke \
        --models mistral llama2 --setups fsdp ddp fx-ddp fx-fsdp2
"""

from __future__ import annotations

import os

# Before torch.distributed touches NCCL: the GPU machine needs NVLink multicast off.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import contextlib
import hashlib
import itertools
import json
import statistics
import sys
import time
import traceback
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import thunder
import torch
import torch.distributed as dist
import torch.nn.functional as F

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard._thunder import software_versions
from thunder_fusion_guard.bench.zoo_run import _timing_alone
from thunder_fusion_guard.distributed import decision_key
from thunder_fusion_guard.measure.timing import interleaved_rounds
from thunder_fusion_guard.passes.collectives import communication_sequence
from thunder_fusion_guard.regions import find_regions

E3NN = "e3nn-nequip-modules"  # the zoo's e3nn-built NequIP (l = 2), under ThunderFX only
NEQUIP = "nequip"  # NequIP from its package (nequip 0.19, the zoo's potential), under ThunderFX only
START = time.monotonic()  # --budget-s counts from here (torch and thunder imported)
MODELS = {"mistral": "Mistral-7B-v0.1", "llama2": "Llama-2-7b-hf", "e3nn": E3NN, "nequip": NEQUIP}
# Seconds one set-up takes on an H200 (Thunder compiles the 2-layer model twice per process, both ranks
# in parallel: ~100 s each for Mistral, whose mask loop makes long traces, ~30 s each for Llama-2 under
# Thunder's FSDP, results/distributed-history/h200x2-distributed-llama2-fsdp.json), eager, the floor and
# timing on top: a set-up starts only when this much of the budget is left (half as much again under
# ThunderFX, which compiles through Dynamo).
SETUP_S = {"mistral": 225.0, "llama2": 80.0, "e3nn": 200.0, "nequip": 330.0}
SETUPS = ("fsdp", "ddp", "fx-ddp", "fx-fsdp2")
# "+cg": with CUDA graphs (Thunder's CUDAGraphTransform; guarded, GuardedCUDAGraphs after the guard, as README
# shows); each guarded variant is checked against the unguarded one of the same kind.
# "+cgcopy": GuardedCUDAGraphs(share_buffers=False), Thunder's grouping and copies: told apart from "+cg", a difference
# of "+cg" from guarded lies in the shared buffers (outputs read in place, gradients handed over) or not.
# "+cgkeep": GuardedCUDAGraphs with no gradient handed to autograd on a graph's buffer (autograd copies each, as
# under Thunder's capture): told apart from "+cg", a difference lies in the handing over or not.
VARIANTS = ("eager", "thunder", "guarded", "thunder+cg", "guarded+cg", "guarded+cgcopy", "guarded+cgkeep")
# Guarded + CUDA graphs is also checked against the guarded and unguarded runs without graphs (graphs change no value;
# Thunder's own capture fails on some set-ups); the last pair naming a guarded variant gives its "vs unguarded" column.
PAIRS = (
    ("guarded", "guarded+cg"),
    ("guarded", "guarded+cgcopy"),
    ("guarded", "guarded+cgkeep"),
    ("thunder", "guarded"),
    ("thunder", "guarded+cg"),
    ("thunder+cg", "guarded+cg"),
)
TRAIN_STEPS = 3
# The noise floor: this many identical steps of the unguarded twin, the largest difference from the first (one repeat
# alone under-reads atomics' spread: e3nn's scatter gradients differed 2.4e-4 in one pair, the guarded run 4.9e-4).
FLOOR_STEPS = 4
APART_LISTED = 16  # where two steps' gradients lie apart: this many parameters listed, furthest first


def log(*parts: Any) -> None:
    print(f"[rank {dist.get_rank()}]", *parts, file=sys.stderr, flush=True)


class Run:
    """What one process needs: its rank, device, options and the deadline shared by all ranks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.smoke = args.cpu_smoke
        self.rank = dist.get_rank()
        self.device = torch.device("cpu") if self.smoke else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self.dtype = torch.float32 if self.smoke else torch.bfloat16
        self.tokens = 16 if self.smoke else args.tokens
        self.deadline = START + args.budget_s
        self.batches: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_left(self) -> float:
        """Seconds left, as rank 0 sees them (every rank then takes the same branch)."""
        left = [self.deadline - time.monotonic()]
        dist.broadcast_object_list(left, src=0)
        return left[0]

    def executors(self) -> dict[str, Any]:
        """On CPU (smoke run) Thunder's torch.compile executor, without the collectives it cannot compile and
        without linear and matmul (left to torch, as nvFuser leaves them: the mask gets hoisted)."""
        if not self.smoke:
            return {}
        from thunder.core.prims import PrimIDs as Prims
        from thunder.distributed.prims import PrimIDs
        from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
        from thunder.extend import ImplInfo

        from thunder_fusion_guard.ops import COMMUNICATION_OPS

        matmuls = {Prims.LINEAR, Prims.MATMUL, "torch.nn.functional.linear", "torch.matmul"}
        ex = TorchCompileExecutor(name="torchcompile_nocomm")
        ex._implmap = {
            op: ImplInfo()
            for op in torch_compile_ex._implmap
            if not isinstance(op, PrimIDs) and str(op) not in COMMUNICATION_OPS and op not in matmuls
        }
        return {"executors": [ex]}


def build(run: Run, name: str) -> tuple[torch.nn.Module, Any]:
    """The model, same weights on every rank and for every variant (seeded); for the e3nn model, its zoo
    entry (module, inputs and loss) as the config."""
    if name in (E3NN, NEQUIP):
        from thunder_fusion_guard import translate_library_ops
        from thunder_fusion_guard.bench.zoo_equivariant import e3nn_nequip
        from thunder_fusion_guard.bench.zoo_potentials import nequip_potential

        translate_library_ops()
        torch.manual_seed(0)
        built = e3nn_nequip(run.device.type) if name == E3NN else nequip_potential(run.device.type)
        return built.module, built
    import litgpt
    from litgpt.model import GPT

    if run.smoke:
        from litgpt_harness import TINY_LITGPT

        config = litgpt.Config.from_name(name, n_layer=run.args.layers, **TINY_LITGPT)
    else:
        config = litgpt.Config.from_name(name, n_layer=run.args.layers)
    torch.manual_seed(0)
    with torch.device(run.device):
        model = GPT(config).to(run.dtype)
    model.max_seq_length = run.tokens
    return model, config


def batch(run: Run, config: Any, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch for a step (made once): batch 1, ``tokens`` tokens; the target is the next token."""
    key = (config.padded_vocab_size, step % (TRAIN_STEPS + 1))
    if key not in run.batches:
        gen = torch.Generator().manual_seed(1000 * key[1] + run.rank)
        ids = torch.randint(0, config.padded_vocab_size, (1, run.tokens + 1), generator=gen).to(run.device)
        run.batches[key] = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    return run.batches[key]


def make_variant(run: Run, setup: str, variant: str, name: str) -> dict[str, Any]:
    """One variant of a set-up: ``fn`` to call, ``module`` whose parameters train, the guard if any."""
    model, config = build(run, name)
    guard = FusionGuard(compare_ranks=True) if variant.startswith("guarded") else None
    transforms: list[Any] = [guard] if guard else []
    if "+cg" in variant:  # guarded: the package's capture; unguarded: Thunder's
        from thunder.transforms.cudagraph import CUDAGraphTransform

        from thunder_fusion_guard import GuardedCUDAGraphs

        shared = not variant.endswith("+cgcopy")
        transforms.append(GuardedCUDAGraphs(share_buffers=shared) if guard else CUDAGraphTransform())
    jit_options = {"transforms": transforms, **run.executors()}
    fn: Any
    if setup == "fsdp":
        if variant == "eager":
            from torch.distributed.fsdp import fully_shard

            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            fn = module = model
        else:
            fn = module = thunder.distributed.fsdp(thunder.jit(model, **jit_options), device=run.device)
    elif setup == "ddp":
        if variant == "eager":
            from torch.nn.parallel import DistributedDataParallel

            fn = module = DistributedDataParallel(model, device_ids=None if run.smoke else [run.device])
        else:
            fn = module = thunder.distributed.ddp(thunder.jit(model, **jit_options))
    else:
        from thunder.dynamo import ThunderCompiler
        from torch.nn.parallel import DistributedDataParallel

        backend = None if variant == "eager" else ThunderCompiler(**jit_options)
        if setup == "fx-fsdp2":
            from torch.distributed.fsdp import fully_shard

            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            module = model
            fn = model if backend is None else torch.compile(model, backend=backend)
        else:
            inner = model if backend is None else torch.compile(model, backend=backend)
            fn = module = DistributedDataParallel(inner, device_ids=None if run.smoke else [run.device])
        jit_options["backend"] = backend
    keep = variant.endswith("+cgkeep")
    return {
        "fn": fn, "module": module, "guard": guard, "config": config, "backend": jit_options.get("backend"),
        "keep_gradients": keep,
    }  # fmt: skip


@contextlib.contextmanager
def gradients_kept(v: dict[str, Any]) -> Any:
    """For a ``+cgkeep`` variant, while it compiles and runs: the capture hands no gradient over on a graph's buffer
    (the graphs' calls are made at compilation, inside the steps; a diagnosis, not an option of the package)."""
    if not v.get("keep_gradients"):
        yield
        return
    from thunder_fusion_guard._thunder import cudagraphs

    was = cudagraphs.handing_over
    cudagraphs.handing_over = lambda graph, call, positions, on_held: call
    try:
        yield
    finally:
        cudagraphs.handing_over = was


def capture_events(guard: Any, seen: int) -> tuple[list[list[str]], int]:
    """The guard's CUDA-graph fallbacks recorded since its ``seen``-th decision: [code, graph, inputs or gradients
    named], and how many decisions it has now."""
    if guard is None:
        return [], seen
    decisions = guard.report.decisions
    events = [
        [d.code, d.region, ",".join(map(str, d.details.get("held") or d.details.get("moved_inputs") or []))[:200]]
        for d in decisions[seen:]
        if d.action == "capture" and d.code and d.code != "captured"
    ]
    return events, len(decisions)


def step(run: Run, v: dict[str, Any], index: int) -> torch.Tensor:
    """One training step without the optimizer: gradients are set afresh."""
    with gradients_kept(v):
        return _step(run, v, index)


def _step(run: Run, v: dict[str, Any], index: int) -> torch.Tensor:
    v["module"].zero_grad(set_to_none=True)
    if not hasattr(v["config"], "padded_vocab_size"):  # the e3nn model: its energy, then the gradients
        built = v["config"]
        loss = built.loss(v["fn"](*built.inputs))
        loss.backward()
        return loss.detach()
    x, target = batch(run, v["config"], index)
    logits = v["fn"](x)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), target.reshape(-1))
    loss.backward()
    return loss.detach()


def grads(v: dict[str, Any]) -> list[torch.Tensor]:
    out = []
    for p in v["module"].parameters():
        if p.grad is not None:
            g = p.grad
            out.append((g.to_local() if hasattr(g, "to_local") else g).detach().clone())
    return out


def maxima(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    """Each pair of gradients' largest absolute difference (0 for an empty one), one pair at a time."""
    return [float((x.float() - y.float()).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b, strict=True)]


def compare(a: list[torch.Tensor], b: list[torch.Tensor], diffs: list[float] | None = None) -> tuple[bool, float]:
    """Whether two steps' gradients are bitwise equal, and their largest difference (``diffs``: their maxima, where
    already taken)."""
    if len(a) != len(b):
        return False, float("inf")
    equal = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return equal, max(maxima(a, b) if diffs is None else diffs, default=0.0)


def where_apart(a: list[torch.Tensor], b: list[torch.Tensor], names: list[str], diffs: list[float]) -> dict[str, Any]:
    """Where two steps' gradients lie furthest apart (``diffs``: their :func:`maxima`): the parameter, the difference,
    that gradient's largest magnitude (a difference of one rounding step or not) and how many of its elements differ."""
    if not diffs:
        return {}
    i = max(range(len(diffs)), key=diffs.__getitem__)
    # every parameter apart, furthest first: [name, difference, elements differing, of]
    order = sorted((k for k, d in enumerate(diffs) if d > 0), key=lambda k: -diffs[k])[:APART_LISTED]
    differing = {k: int((a[k] != b[k]).sum()) for k in {i, *order}}  # each gradient compared once

    def name(k: int) -> str:
        return names[k] if k < len(names) else str(k)

    return {
        "parameter": name(i),
        "diff": diffs[i],
        "magnitude": float(a[i].float().abs().max()) if a[i].numel() else 0.0,
        "elements": differing[i],
        "of": a[i].numel(),
        "parameters_apart": sum(d > 0 for d in diffs),
        "apart": [[name(k), diffs[k], differing[k], a[k].numel()] for k in order],
    }


def train(run: Run, v: dict[str, Any]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """TRAIN_STEPS SGD steps: each step's loss and gradients."""
    # the e3nn model's energy has gradients of about 1e3: a step of 1e-3 along them diverges in two steps
    lr = 1e-3 if hasattr(v["config"], "padded_vocab_size") else 1e-6
    opt = torch.optim.SGD(v["module"].parameters(), lr=lr)
    losses, all_grads = [], []
    seen, v["capture_per_step"] = 0, []
    for i in range(TRAIN_STEPS):
        try:
            losses.append(step(run, v, i))
        except Exception as e:
            e.add_note(f"in training step {i + 1} of {TRAIN_STEPS}")
            raise
        events, seen = capture_events(v["guard"], seen)
        v["capture_per_step"].append(events)
        all_grads.append(grads(v))
        opt.step()
    run.sync()
    return losses, all_grads


def thunder_programs(v: dict[str, Any]) -> list[Any]:
    if v["backend"] is not None:
        return [fn for info in v["backend"].subgraph_infos for fn in info.thunder_compiled_fns or ()]
    return [v["fn"]]


def trace_facts(v: dict[str, Any]) -> dict[str, Any]:
    """Fusion regions and the communication ops of the final traces: ``collectives`` all of them in the order a step
    runs them (each program's forward in turn, then the backwards in reverse; a guarded and an unguarded run may split
    one step into other numbers of traces, so the sequences are compared, not the traces), ``traces`` how many."""
    regions, forward, backward, ops = 0, [], [], []
    unread = read = 0
    for program in thunder_programs(v):
        try:
            traces = [thunder.last_traces(program)[-1], *thunder.last_backward_traces(program)[-1:]]
        except (TypeError, AttributeError, IndexError):  # a program Thunder keeps no traces of: said, not read
            unread += 1
            continue
        for index, trace in enumerate(traces):
            read += 1
            found = find_regions(trace)
            regions += len(found)
            ops += [[r.name, r.ops] for r in found]
            sequence = [repr(c) for c in communication_sequence(trace)]
            if index == 0:
                forward += sequence
            else:
                backward = sequence + backward
    # The regions' ops, in order, as a digest: are the programs the ranks run the same, guard or no guard?
    digest = hashlib.sha256(json.dumps(ops).encode()).hexdigest()[:16]
    return {
        "regions": regions,
        "collectives": forward + backward,
        "traces": read,
        "regions_digest": digest,
        "programs_unread": unread,
    }


def guard_facts(guard: FusionGuard) -> dict[str, Any]:
    """What the guard decided on this rank: counts, hoists, a digest of the decision keys to compare ranks."""
    keys = [list(map(str, decision_key(d))) for d in guard.report.decisions]
    return {
        "decisions": guard.report.counts(),
        "hoists": sum(d.action == "hoist" for d in guard.report.decisions),
        # how the CUDA graphs went: captured, and each fallback (held, moved, re-entered, uncaptured) with its count
        "capture": dict(Counter(d.code for d in guard.report.decisions if d.action == "capture" and d.code)),
        "decision_keys": len(keys),
        "decisions_digest": hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16],
        "rank_problems": guard.check_ranks(),  # a collective: every rank calls it here
    }


@contextlib.contextmanager
def timing_alone(run: Run) -> Any:
    """Where ``TFG_ZOO_LOCK`` names a file, jobs side by side time one at a time: rank 0 holds the zoo's timing lock
    (``_timing_alone``) while its job times, the other ranks wait for it at a barrier."""
    with _timing_alone() if run.rank == 0 else contextlib.nullcontext():
        dist.barrier()
        try:
            yield
        finally:
            dist.barrier()


def run_setup(run: Run, setup: str, name: str) -> dict[str, Any]:
    info: dict[str, Any] = {"setup": setup, "variants": {}}
    made: dict[str, dict[str, Any]] = {}
    # Correctness: each variant trains 3 SGD steps from the same weights on the same batches.
    trained: dict[str, tuple] = {}
    for variant in run.args.variants:
        entry: dict[str, Any] = {}
        info["variants"][variant] = entry
        try:
            t0 = time.perf_counter()
            v = make_variant(run, setup, variant, name)
            if any(variant == base for base, _ in PAIRS):  # a twin: trained again from these weights (its floor)
                v["initial"] = [p.detach().clone() for p in v["module"].parameters()]
            trained[variant] = train(run, v)
            entry["first_steps_s"] = round(time.perf_counter() - t0, 1)
            entry["losses"] = [float(x) for x in trained[variant][0]]
            made[variant] = v
            if v["guard"] is not None:
                entry["capture_per_step"] = v["capture_per_step"]
            if variant != "eager":
                entry.update(trace_facts(v))
            took = entry["first_steps_s"]
            log(f"{name} {setup} {variant}: 3 steps in {took} s (compile included), losses {entry['losses']}")
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            entry["where"] = traceback.extract_tb(e.__traceback__)[-1].name
            log(f"{name} {setup} {variant} failed: {entry['error']}")
            if run.rank == 0:
                traceback.print_exc()  # the whole story in the job's log; the JSON keeps one line
        dist.barrier()
    for base, guarded_name in PAIRS:
        if guarded_name not in run.args.variants:
            continue
        # Outside the try above: check_ranks is a collective, so every rank calls it whatever happened.
        guarded = made.get(guarded_name)
        have_guard: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(have_guard, guarded is not None)
        if all(have_guard) and "decisions_digest" not in info["variants"][guarded_name]:
            info["variants"][guarded_name].update(guard_facts(guarded["guard"]))
        if base in trained and guarded_name in trained:
            info.update(check_pair(run, info, made, trained, base, guarded_name))
    # Timing: the variants that ran, interleaved round by round.
    ready = [k for k in run.args.variants if k in made]
    indices = {k: itertools.count() for k in ready}  # each variant sees batches 0, 1, 2, ... as before
    with timing_alone(run):
        timed = interleaved_rounds(
            {k: (lambda v=made[k], i=indices[k]: step(run, v, next(i))) for k in ready},
            run.args.rounds,
            warmup=run.args.warmup,
            sync=run.sync,
            stop=lambda _round: run.time_left() < 20,
        )
    if timed.cut_at is not None:
        info["timing_cut_short"] = True
    for variant, s in timed.samples.items():
        if s:
            info["variants"][variant]["median_ms"] = round(statistics.median(s) * 1e3, 3)
            info["variants"][variant]["rounds"] = len(s)
    del made, trained
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return info


def check_pair(
    run: Run, info: dict[str, Any], made: dict[str, Any], trained: dict[str, tuple], base: str, guarded: str
) -> dict[str, Any]:
    """A guarded variant against its unguarded twin: losses and gradients of the three training steps, the
    twin against itself (FLOOR_STEPS identical steps: the noise floor, atomics in backward kernels), collectives."""
    (lt, gt), (lg, gg) = trained[base], trained[guarded]
    names = [n for n, p in made[guarded]["module"].named_parameters() if p.grad is not None]
    per_step, apart = [], []
    for a, b in zip(gt, gg, strict=True):
        diffs = maxima(a, b) if len(a) == len(b) else []
        per_step.append(compare(a, b, diffs))
        apart.append(where_apart(a, b, names, diffs))
    v = made[base]
    first_loss, first = step(run, v, 0), grads(v)
    against, losses_equal = [], True
    for _ in range(FLOOR_STEPS - 1):  # one repeat's gradients held at a time
        losses_equal &= torch.equal(first_loss, step(run, v, 0))
        against.append(compare(first, grads(v)))
    floor_equal, floor = all(e for e, _ in against), max(d for _, d in against)
    again = retrained(run, v, trained[base])
    within = [d <= max(floor, f) for (_, d), f in zip(per_step, again["grads_max_abs_diff_per_step"], strict=True)]
    run.sync()
    return {
        f"{base}_retrained": again,
        f"{base}_repeat": {
            "loss_equal": losses_equal,
            "grads_equal": floor_equal,
            "diff": floor,
            "steps": FLOOR_STEPS,
        },
        f"{guarded}_vs_{base}": {
            "losses_equal": all(torch.equal(a, b) for a, b in zip(lt, lg, strict=True)),
            "grads_equal": all(e for e, _ in per_step),
            "grads_max_abs_diff_first_step": per_step[0][1],
            "grads_max_abs_diff": max(d for _, d in per_step),
            "grads_max_abs_diff_per_step": [d for _, d in per_step],
            "grads_apart_per_step": apart,
            "grads_within_floor": per_step[0][1] <= floor,
            "grads_within_floor_all_steps": all(within),
            "collectives_equal": info["variants"][base].get("collectives")
            == info["variants"][guarded].get("collectives"),
        },
    }


def retrained(run: Run, v: dict[str, Any], first: tuple) -> dict[str, Any]:
    """The twin trained again from the same weights on the same batches (once per twin): each step's gradients against
    its first training's, the noise floor of later steps (atomics whose spread shows on some batches only)."""
    if "retrained" not in v:
        with torch.no_grad():
            for p, initial in zip(v["module"].parameters(), v["initial"], strict=True):
                p.copy_(initial)
        losses, all_grads = train(run, v)
        diffs = [
            compare(a, b)[1] if len(a) == len(b) else float("inf") for a, b in zip(first[1], all_grads, strict=True)
        ]
        v["retrained"] = {
            "losses_equal": all(torch.equal(a, b) for a, b in zip(first[0], losses, strict=True)),
            "grads_max_abs_diff_per_step": diffs,
        }
    return v["retrained"]


def summary(entry: dict[str, Any], world: int) -> dict[str, Any]:
    """One set-up's checks over all ranks, per guarded variant: bits, decisions alike on every rank,
    collectives unchanged, the step time against its unguarded twin."""
    ranks = entry["ranks"]
    out: dict[str, Any] = {}
    for r in range(world):
        out[f"rank{r}_ms"] = {k: v.get("median_ms") for k, v in ranks[r]["variants"].items()}
    for base, name in PAIRS:
        ms = [
            (r["variants"].get(name, {}).get("median_ms"), r["variants"].get(base, {}).get("median_ms")) for r in ranks
        ]
        if all(g and b for g, b in ms):
            out[f"{name}_over_{base}_per_rank"] = [round(g / b, 3) for g, b in ms]
        checks = [r.get(f"{name}_vs_{base}") for r in ranks]
        floors = [r.get(f"{base}_repeat") for r in ranks]
        if all(checks) and all(floors):
            out[f"{name}_vs_{base}"] = {
                "losses_equal": all(c["losses_equal"] for c in checks),
                "grads_max_abs_diff": max(c["grads_max_abs_diff_first_step"] for c in checks),
                "grads_max_abs_diff_all_steps": max(c["grads_max_abs_diff"] for c in checks),
                "floor_max_abs_diff": max(f["diff"] for f in floors),
                "grads_within_floor": all(c["grads_within_floor"] for c in checks),
                "train_floor_max_abs_diff": max(
                    max(r.get(f"{base}_retrained", {}).get("grads_max_abs_diff_per_step") or [float("nan")])
                    for r in ranks
                ),
                "grads_within_floor_all_steps": all(c.get("grads_within_floor_all_steps") for c in checks),
                "grads_bitwise_equal": all(c["grads_equal"] for c in checks),
                "collectives_equal": all(c["collectives_equal"] for c in checks),
            }
        for variant in (base, name):
            digests = {r["variants"].get(variant, {}).get("regions_digest") for r in ranks}
            if None not in digests:
                out[f"{variant}_regions_equal_on_all_ranks"] = len(digests) == 1
        guarded = [r["variants"].get(name, {}) for r in ranks]
        if all("decisions_digest" in g for g in guarded):
            out[f"{name}_decisions"] = {
                "equal_on_all_ranks": len({g["decisions_digest"] for g in guarded}) == 1
                and not any(g["rank_problems"] for g in guarded),
                "hoists_per_rank": [g["hoists"] for g in guarded],
                "rank0": guarded[0]["decisions"],
            }
    return out


def table(results: dict[str, Any]) -> str:
    """Markdown: one row per model, set-up and variant, median ms on each rank and against the unguarded twin;
    then the checks of each guarded variant."""
    world = results["world_size"]
    header = ["model", "setup", "variant", *(f"rank {r} ms" for r in range(world)), "vs unguarded", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    checks = []
    twin = {g: b for b, g in PAIRS}
    for entry in results["runs"]:
        per_rank = entry["ranks"]
        if "skipped" in entry:
            lines.append(f"| {entry['model']} | {entry['setup']} | - |{' - |' * world} - | {entry['skipped']} |")
            continue
        s = entry.get("summary", {})
        for variant in VARIANTS:
            cells = [per_rank[r]["variants"].get(variant) for r in range(world)]
            if not any(cells):
                continue
            ms = [(c or {}).get("median_ms") for c in cells]
            ratios = s.get(f"{variant}_over_{twin.get(variant)}_per_rank") or []
            note = (cells[0] or {}).get("error", "")
            fallbacks = {k: n for k, n in ((cells[0] or {}).get("capture") or {}).items() if k != "captured"}
            note = note or ", ".join(f"{k} {n}" for k, n in sorted(fallbacks.items()))
            row = [entry["model"], entry["setup"], variant, *(f"{m:.2f}" if m else "-" for m in ms)]
            row += [" ".join(f"{r:.3f}" for r in ratios) or "-", note]
            lines.append("| " + " | ".join(str(c) for c in row) + " |")
        checked = {name for base, name in PAIRS if s.get(f"{name}_vs_{base}")}
        said: set[str] = set()
        for base, name in PAIRS:
            c, d = s.get(f"{name}_vs_{base}"), s.get(f"{name}_decisions", {})
            # a pair whose twin did not run: one row for the variant's decisions, where no other pair checked it
            if c or (d and name not in checked and name not in said):
                said.add(name)
                base = base if c else "-"
                c = c or {}
                checks.append(
                    f"| {entry['model']} | {entry['setup']} | {name} vs {base} | {c.get('losses_equal', '-')} | "
                    f"{c.get('grads_bitwise_equal', '-')} | {c.get('grads_max_abs_diff', '-')} | "
                    f"{c.get('grads_max_abs_diff_all_steps', '-')} | "
                    f"{c.get('floor_max_abs_diff', '-')} | {c.get('grads_within_floor', '-')} | "
                    f"{c.get('train_floor_max_abs_diff', '-')} | {c.get('grads_within_floor_all_steps', '-')} | "
                    f"{c.get('collectives_equal', '-')} | {s.get(f'{base}_regions_equal_on_all_ranks', '-')}, "
                    f"{s.get(f'{name}_regions_equal_on_all_ranks', '-')} | {d.get('equal_on_all_ranks', '-')} | "
                    f"{d.get('hoists_per_rank', '-')} |"
                )
    if checks:
        lines += [
            "",
            "| model | setup | variant vs unguarded twin | losses equal | grads bitwise equal | grads max abs diff "
            "(step 1) | (3 steps) | unguarded vs itself (4 identical steps) | within the floor | unguarded trained "
            "again (3 steps) | 3 steps within the floors | collectives equal | regions alike on all ranks (unguarded, "
            "guarded) | decisions equal on all ranks | hoists per rank |",
            "|" + " --- |" * 15,
            *checks,
        ]
    return "\n".join(lines)


def merge(out: Path, parts: list[Path], commit: str | None, package: str) -> Path:
    """Several runs' JSON (set-ups run side by side as separate jobs) as one file, ``out`` (and its ``.md``); where
    ``out`` is a folder, named there ``distributed-<gpu>x<ranks>-<short sha>.json``. The file written."""
    from gpu_acceptance import gpu_slug

    runs = [json.loads(part.read_text()) for part in parts]
    merged = {**runs[0], "commit": commit, "package_sha256": package, "runs": [r for run in runs for r in run["runs"]]}
    merged["jobs"] = [{"file": part.name, "wall_s": run.get("wall_s")} for part, run in zip(parts, runs, strict=True)]
    if out.is_dir():
        short = commit[:7] if commit else "nocommit"
        out = out / f"distributed-{gpu_slug(merged['device'])}x{merged['world_size']}-{short}.json"
    out.write_text(json.dumps(merged, indent=1) + "\n")
    head = f"# {merged['world_size']} ranks on {merged['device']}, {merged['versions']}, commit {commit}\n\n"
    out.with_suffix(".md").write_text(head + table(merged) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["llama2"])
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=["fsdp"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=["eager", "thunder", "guarded"])
    p.add_argument("--layers", type=int, default=2, help="litgpt layers (2)")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--budget-s",
        type=float,
        default=520.0,
        help="seconds from the end of the imports: a set-up starts only if its expected time fits (520)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/gpu"))
    p.add_argument(
        "--no-ddp-optimizer",
        action="store_true",
        help="ThunderFX under DDP as one graph (torch._dynamo.config.optimize_ddp = False), not split at DDP's buckets",
    )
    p.add_argument(
        "--detect-anomaly",
        action="store_true",
        help="autograd's anomaly mode: a backward error names the forward op that made the value (slow: no timing)",
    )
    p.add_argument("--cpu-smoke", action="store_true", help="CPU, gloo, tiny configs: check the script itself")
    p.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON", help="merge runs' JSON into --out (a file, or a folder)"
    )
    args = p.parse_args()
    if args.merge:
        from package_hash import package_sha256, resolve_commit

        written = merge(Path(args.out), args.merge, resolve_commit(None)[0], package_sha256())
        print(written.with_suffix(".md").read_text(), flush=True)
        return
    smoke = args.cpu_smoke
    if args.no_ddp_optimizer:
        torch._dynamo.config.optimize_ddp = False
    if args.detect_anomaly:
        torch.autograd.set_detect_anomaly(True)
    if not smoke:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo" if smoke else "nccl", timeout=timedelta(seconds=900))
    run = Run(args)
    results: dict[str, Any] = {
        "device": "cpu" if smoke else torch.cuda.get_device_name(),
        "world_size": dist.get_world_size(),
        "versions": software_versions(),
        "settings": {
            "tokens": run.tokens,
            "layers": args.layers,
            "batch_per_rank": 1,
            "dtype": str(run.dtype),
            "rounds": args.rounds,
            "ddp_optimizer": not args.no_ddp_optimizer,
            "detect_anomaly": args.detect_anomaly,
        },
        "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "runs": [],
    }
    out = Path(args.out)
    stem = f"gpu-distributed-{'-'.join(args.models)}-{'-'.join(args.setups)}-{'-'.join(args.variants)}"
    stem += "-cpu-smoke" if smoke else ""

    def write() -> str:
        text = table(results)
        head = f"# litgpt, {results['world_size']} ranks on {results['device']}, {results['versions']}\n\n"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / f"{stem}.md").write_text(head + text + "\n")
        return text

    for key in args.models:
        for setup in args.setups:
            entry: dict[str, Any] = {"model": MODELS[key], "setup": setup}
            needs = 30.0 if run.smoke else SETUP_S[key] * (1.5 if setup.startswith("fx") else 1.0)
            if run.time_left() < needs:
                entry["skipped"] = "time budget spent"
                if run.rank == 0:
                    log(f"{MODELS[key]} {setup}: skipped, not enough of --budget-s left")
                mine = {"variants": {}}
            else:
                mine = run_setup(run, setup, MODELS[key])
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            entry["ranks"] = gathered
            if "skipped" not in entry:
                entry["summary"] = summary(entry, dist.get_world_size())
            results["runs"].append(entry)
            if run.rank == 0:
                write()  # after every set-up: a run cut short keeps what it finished
    if run.rank == 0:
        results["wall_s"] = round(time.monotonic() - START, 1)
        print(write(), flush=True)
        print(f"wall {results['wall_s']} s since start", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The device kit loads nvFuser's torch-2.10 build with lazy symbol binding; at interpreter teardown it
    # resolves a logging symbol torch 2.11 lacks and the process dies with 127 after the results are
    # written. Leave at once instead, so torchrun reports the run's own status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
