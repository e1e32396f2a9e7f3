"""litgpt on two GPUs: eager vs thunder vs guarded under FSDP (and DDP), one training step, per rank.

Run from the repo root on a machine with two GPUs, after ``source .gpu/setup.sh`` (each command stays
under 9 minutes on H200s; ``python3 -m torch.distributed.run`` is ``torchrun``):

    torchrun --nproc-per-node 2 benchmarks/gpu_distributed.py --models llama2 mistral --setups fsdp
    torchrun --nproc-per-node 2 benchmarks/gpu_distributed.py --models llama2 --setups ddp fx-ddp fx-fsdp2
    torchrun --nproc-per-node 2 benchmarks/gpu_distributed.py --models mistral --setups ddp

Setting: litgpt Mistral-7B-v0.1 / Llama-2-7b-hf at 2 layers, batch 1 per rank, 512 tokens, bf16, one
training step (forward, cross-entropy, backward). Set-ups (``--setups``):

- ``fsdp``: eager = PyTorch FSDP2 (``fully_shard`` per block and the root); thunder =
  ``thunder.distributed.fsdp(thunder.jit(model))``; guarded = the same with ``FusionGuard()``.
- ``ddp``: eager = PyTorch ``DistributedDataParallel``; thunder = ``thunder.distributed.ddp(thunder.jit(model))``
  (with nvFuser each gradient is all-reduced on its own: no buckets); guarded = the same with the guard.
- ``fx-ddp`` / ``fx-fsdp2``: ThunderFX (``torch.compile`` with Thunder's backend) under PyTorch's DDP /
  FSDP2, with and without the guard (eager: the same wrapper without compiling).

For each set-up: first a correctness phase (thunder and guarded train 3 SGD steps from the same weights
on the same batches; losses and gradients compared to the bit, and thunder against itself for the noise
floor), then the timing phase: ``--rounds`` steps of each variant interleaved, median ms per rank. Every
rank must run the same variants in the same order (each step has collectives), so a set-up that no
longer fits ``--budget-s`` is skipped on all ranks (rank 0 decides). The guard runs with
``compare_ranks=True`` and ``guard.check_ranks()`` is called after the step: the ranks' decisions are
compared. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

Writes ``$OUT/gpu-distributed-<models>.json`` and ``.md`` (rank 0; every rank's numbers gathered) and
prints the table last. ``--cpu-smoke`` runs the same code on CPU (gloo, tiny configs) to check it.
"""

from __future__ import annotations

import os

# Before torch.distributed touches NCCL: the GPU machine needs NVLink multicast off.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import json
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import thunder
import torch
import torch.distributed as dist
import torch.nn.functional as F

from thunder_fusion_guard import FusionGuard
from thunder_fusion_guard._thunder import software_versions
from thunder_fusion_guard.passes.collectives import communication_sequence
from thunder_fusion_guard.regions import find_regions

MODELS = {"mistral": "Mistral-7B-v0.1", "llama2": "Llama-2-7b-hf"}
# Seconds one set-up takes on an H200 (Thunder compiles the model twice, unguarded ~160 s and guarded
# ~80 s for Mistral, ~35 s each for Llama-2; results/h200-models-run6.json), with some slack: a set-up
# starts only when this much of the budget is left (half as much again under ThunderFX, not yet measured).
SETUP_S = {"mistral": 330.0, "llama2": 120.0}
SETUPS = ("fsdp", "ddp", "fx-ddp", "fx-fsdp2")
VARIANTS = ("eager", "thunder", "guarded")
TRAIN_STEPS = 3


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
        self.deadline = time.monotonic() + args.budget_s
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
        """On CPU (smoke run) Thunder's torch.compile executor, without the collectives it cannot compile."""
        if not self.smoke:
            return {}
        from thunder.distributed.prims import PrimIDs
        from thunder.executors.torch_compile import TorchCompileExecutor, torch_compile_ex
        from thunder.extend import ImplInfo

        from thunder_fusion_guard.ops import COMMUNICATION_OPS

        ex = TorchCompileExecutor(name="torchcompile_nocomm")
        ex._implmap = {
            op: ImplInfo()
            for op in torch_compile_ex._implmap
            if not isinstance(op, PrimIDs) and str(op) not in COMMUNICATION_OPS
        }
        return {"executors": [ex]}


def build(run: Run, name: str) -> tuple[torch.nn.Module, Any]:
    """The model, same weights on every rank and for every variant (seeded)."""
    import litgpt
    from litgpt.model import GPT

    if run.smoke:
        config = litgpt.Config.from_name(
            name,
            n_layer=2,
            n_embd=64,
            n_head=4,
            n_query_groups=2,
            head_size=16,
            intermediate_size=128,
            vocab_size=256,
            padded_vocab_size=256,
        )
    else:
        config = litgpt.Config.from_name(name, n_layer=2)
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
    guard = FusionGuard(compare_ranks=True) if variant == "guarded" else None
    transforms = [guard] if guard else []
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
    return {"fn": fn, "module": module, "guard": guard, "config": config, "backend": jit_options.get("backend")}


def step(run: Run, v: dict[str, Any], index: int) -> torch.Tensor:
    """One training step without the optimizer: gradients are set afresh."""
    x, target = batch(run, v["config"], index)
    v["module"].zero_grad(set_to_none=True)
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


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[bool, float]:
    if len(a) != len(b):
        return False, float("inf")
    equal = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    diff = max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True)), default=0.0)
    return equal, diff


def train(run: Run, v: dict[str, Any]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """TRAIN_STEPS SGD steps: each step's loss and gradients."""
    opt = torch.optim.SGD(v["module"].parameters(), lr=1e-3)
    losses, all_grads = [], []
    for i in range(TRAIN_STEPS):
        losses.append(step(run, v, i))
        all_grads.append(grads(v))
        opt.step()
    run.sync()
    return losses, all_grads


def thunder_programs(v: dict[str, Any]) -> list[Any]:
    if v["backend"] is not None:
        return [fn for info in v["backend"].subgraph_infos for fn in info.thunder_compiled_fns or ()]
    return [v["fn"]]


def trace_facts(v: dict[str, Any]) -> dict[str, Any]:
    """Fusion regions and the communication ops, in order, of the final traces."""
    regions, comms = 0, []
    for program in thunder_programs(v):
        traces = [thunder.last_traces(program)[-1], *thunder.last_backward_traces(program)[-1:]]
        for trace in traces:
            regions += len(find_regions(trace))
            comms.append(repr(communication_sequence(trace)))
    return {"regions": regions, "collectives": comms}


def run_setup(run: Run, setup: str, name: str) -> dict[str, Any]:
    info: dict[str, Any] = {"setup": setup, "variants": {}}
    made: dict[str, dict[str, Any]] = {}
    # Correctness: thunder and guarded, 3 SGD steps each from the same weights and batches.
    trained: dict[str, tuple] = {}
    for variant in VARIANTS:
        entry: dict[str, Any] = {}
        info["variants"][variant] = entry
        try:
            t0 = time.perf_counter()
            v = make_variant(run, setup, variant, name)
            trained[variant] = train(run, v)
            entry["first_steps_s"] = round(time.perf_counter() - t0, 1)
            entry["losses"] = [float(x) for x in trained[variant][0]]
            made[variant] = v
            if variant != "eager":
                entry.update(trace_facts(v))
            if v["guard"] is not None:
                entry["decisions"] = v["guard"].report.counts()
                entry["rank_problems"] = v["guard"].check_ranks()
            log(f"{name} {setup} {variant}: 3 steps in {entry['first_steps_s']} s (compile included)")
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            entry["where"] = traceback.extract_tb(e.__traceback__)[-1].name
            log(f"{name} {setup} {variant} failed: {entry['error']}")
        dist.barrier()
    if "thunder" in trained and "guarded" in trained:
        (lt, gt), (lg, gg) = trained["thunder"], trained["guarded"]
        eq = [compare(a, b) for a, b in zip(gt, gg, strict=True)]
        info["guarded_vs_thunder"] = {
            "losses_equal": all(torch.equal(a, b) for a, b in zip(lt, lg, strict=True)),
            "grads_equal": all(e for e, _ in eq),
            "grads_max_abs_diff": max(d for _, d in eq),
            "collectives_equal": info["variants"]["thunder"].get("collectives")
            == info["variants"]["guarded"].get("collectives"),
        }
        # Thunder against itself, same weights, same batch: the noise floor (atomics in backward kernels).
        v = made["thunder"]
        first = (step(run, v, 0), grads(v))
        again = (step(run, v, 0), grads(v))
        equal, diff = compare(first[1], again[1])
        info["thunder_repeat"] = {"loss_equal": torch.equal(first[0], again[0]), "grads_equal": equal, "diff": diff}
    # Timing: the variants that ran, interleaved round by round.
    ready = [k for k in VARIANTS if k in made]
    samples: dict[str, list[float]] = {k: [] for k in ready}
    for i in range(run.args.warmup + run.args.rounds):
        if run.time_left() < 20:
            info["timing_cut_short"] = True
            break
        for variant in ready:
            run.sync()
            t0 = time.perf_counter()
            step(run, made[variant], i)
            run.sync()
            if i >= run.args.warmup:
                samples[variant].append((time.perf_counter() - t0) * 1e3)
    for variant, s in samples.items():
        if s:
            info["variants"][variant]["median_ms"] = round(statistics.median(s), 3)
            info["variants"][variant]["rounds"] = len(s)
    del made, trained
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return info


def table(results: dict[str, Any]) -> str:
    """Markdown: one row per model, set-up and variant; median ms on each rank."""
    world = results["world_size"]
    header = ["model", "setup", "variant", *(f"rank {r} ms" for r in range(world)), "vs thunder (rank 0)", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for entry in results["runs"]:
        per_rank = entry["ranks"]
        if "skipped" in entry:
            lines.append(
                f"| {entry['model']} | {entry['setup']} | - |{' - |' * world} - | skipped: {entry['skipped']} |"
            )
            continue
        for variant in VARIANTS:
            cells = [per_rank[r]["variants"].get(variant, {}) for r in range(world)]
            ms = [c.get("median_ms") for c in cells]
            base = per_rank[0]["variants"].get("thunder", {}).get("median_ms")
            ratio = f"{ms[0] / base:.3f}" if ms[0] and base else ""
            note = cells[0].get("error", "")
            if variant == "guarded" and "guarded_vs_thunder" in per_rank[0]:
                eq = [per_rank[r]["guarded_vs_thunder"] for r in range(world)]
                agree = not any(c.get("rank_problems") for c in cells)
                note = ", ".join(
                    [
                        f"losses equal {all(e['losses_equal'] for e in eq)}",
                        f"grads equal {all(e['grads_equal'] for e in eq)}",
                        f"collectives equal {all(e['collectives_equal'] for e in eq)}",
                        f"ranks agree {agree}",
                    ]
                )
            row = [entry["model"], entry["setup"], variant, *(f"{m:.2f}" if m else "-" for m in ms), ratio, note]
            lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["llama2"])
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=["fsdp"])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--budget-s", type=float, default=480.0, help="start a set-up only if it fits in this many seconds (480)"
    )
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/gpu"))
    p.add_argument("--cpu-smoke", action="store_true", help="CPU, gloo, tiny configs: check the script itself")
    args = p.parse_args()
    smoke = args.cpu_smoke
    if not smoke:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo" if smoke else "nccl", timeout=timedelta(seconds=900))
    run = Run(args)
    results: dict[str, Any] = {
        "device": "cpu" if smoke else torch.cuda.get_device_name(),
        "world_size": dist.get_world_size(),
        "versions": software_versions(),
        "settings": {"tokens": run.tokens, "batch_per_rank": 1, "dtype": str(run.dtype), "rounds": args.rounds},
        "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "runs": [],
    }
    out = Path(args.out)
    stem = f"gpu-distributed-{'-'.join(args.models)}" + ("-cpu-smoke" if smoke else "")
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
            results["runs"].append(entry)
            if run.rank == 0:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    if run.rank == 0:
        text = table(results)
        head = f"# litgpt, {results['world_size']} ranks on {results['device']}, {results['versions']}\n\n"
        (out / f"{stem}.md").write_text(head + text + "\n")
        print(text, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
