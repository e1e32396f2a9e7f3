"""Hugging Face transformers models through ThunderFX on a GPU: eager, ThunderFX, guarded ThunderFX, guarded
ThunderFX with ``choose_backends`` and torch.compile, one training step each
(``model(ids, labels=ids).loss.backward()``), A/B interleaved.

    source .gpu/setup.sh && python3 benchmarks/gpu_hf.py --models llama qwen2 phi --out $OUT

Models are built from their configs with the real widths, 2 layers, bf16, random weights (no downloads),
``attn_implementation="sdpa"`` (``--attn eager`` for transformers' own attention), batch 1, 512 tokens.
The guarded variant's loss and gradients are compared
bitwise with unguarded ThunderFX's (same weights, same inputs), and both with eager's by the largest difference.
Per variant: first call (trace and compile) seconds, then median and quartiles of ``--rounds`` interleaved
steps. Writes ``<out>/<tag>.json`` and ``.md`` (``--tag``, default hf-thunderfx); the table is printed last.
``--device cpu`` with tiny widths is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# name: (config class, model class, widths at full size)
MODELS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064
        ),
    ),
    "phi": (
        "PhiConfig",
        "PhiForCausalLM",
        dict(
            hidden_size=2560, intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32, vocab_size=51200
        ),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=1600, n_head=25, n_inner=6400, vocab_size=50257, n_layer=2, n_positions=1024),
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=32, vocab_size=50432),
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(hidden_size=2048, ffn_dim=8192, num_attention_heads=32, vocab_size=50272, word_embed_proj_dim=2048),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=32000
        ),
    ),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
# Architectures whose widths have other names: their tiny (CPU smoke) widths.
TINY_BY_NAME = {
    "gpt2": dict(n_embd=64, n_head=4, n_inner=128, vocab_size=256, n_layer=2, n_positions=64),
    "opt": dict(hidden_size=64, ffn_dim=128, num_attention_heads=4, vocab_size=256, word_embed_proj_dim=64),
    "gpt_neox": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256),
    "phi": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, vocab_size=256),
}
# guarded+choice: guarded ThunderFX, then choose_backends (each Thunder subgraph by Thunder, Inductor or eager,
# whichever times fastest; the opt-in where other bits are allowed), within its first call
VARIANTS = ("eager", "thunderfx", "guarded", "guarded+choice", "inductor")


def build(name: str, device: str, tokens: int, attn: str = "sdpa") -> tuple[Any, Any]:
    import torch
    import transformers

    config_cls, model_cls, widths = MODELS[name]
    if device != "cuda":
        widths = TINY_BY_NAME.get(name, TINY)
    extra = {} if name == "gpt2" else {"num_hidden_layers": 2, "max_position_embeddings": 4096}
    config = getattr(transformers, config_cls)(**extra, **widths)
    config._attn_implementation = attn
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = getattr(transformers, model_cls)(config).to(dtype)
    model.train()
    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    return model, ids


def compile_variant(model: Any, variant: str) -> tuple[Any, Any]:
    """The variant's callable and its FusionGuard (None unless guarded)."""
    import torch

    if variant == "eager":
        return model, None
    if variant == "inductor":
        return torch.compile(model), None
    from thunder.dynamo import thunderfx

    from thunder_fusion_guard import FusionGuard

    guard = FusionGuard() if variant.startswith("guarded") else None
    return thunderfx(model, transforms=[guard] if guard else []), guard


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from thunder_fusion_guard.measure.timing import interleaved_rounds, quartiles

    device = args.device
    model, ids = build(name, device, args.tokens, args.attn)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, Any] = {"model": name, "variants": {}}
    steps, results = {}, {}
    for variant in args.variants:
        fn, guard = compile_variant(model, variant)

        def step(fn=fn, keep: bool = False) -> Any:
            if keep:  # the compared steps draw the same random numbers (dropout)
                torch.manual_seed(1234)
            model.zero_grad(set_to_none=True)
            loss = fn(ids, labels=ids).loss
            loss.backward()
            if keep:
                return [loss.detach().clone()] + [p.grad.detach().clone() for p in model.parameters()]
            return None

        start = time.perf_counter()
        try:
            step()
            if variant == "guarded+choice":
                from thunder_fusion_guard import choose_backends

                choices = choose_backends(fn, ids, labels=ids, guard=guard)
            sync()
            first = time.perf_counter() - start
            step()
            results[variant] = step(keep=True)
            sync()
        except Exception as e:  # one variant failing leaves the others to time
            out["variants"][variant] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"[{name}] {variant} failed: {e}", file=sys.stderr, flush=True)
            continue
        steps[variant] = step
        if variant == "thunderfx":  # ThunderFX against itself: the noise floor of the bitwise comparison
            again = step(keep=True)
            out["thunderfx_repeat_bitwise_equal"] = all(
                torch.equal(a, b) for a, b in zip(again, results[variant], strict=True)
            )
        out["variants"][variant] = {"first_call_s": round(first, 2)}
        print(f"[{name}] {variant}: first call {first:.1f} s", file=sys.stderr, flush=True)
        if variant in ("thunderfx", "guarded", "guarded+choice"):
            from thunder_fusion_guard._thunder import thunderfx_subgraphs

            out["variants"][variant]["thunder_subgraphs"] = len(thunderfx_subgraphs(fn))
        if variant == "guarded+choice":
            out["variants"][variant]["backend_choices"] = [c.line() for c in choices]
        if guard is not None:
            actions: dict[str, int] = {}
            for d in guard.report:
                actions[d.action] = actions.get(d.action, 0) + 1
            out["variants"][variant]["decisions"] = actions
    timed = interleaved_rounds(steps, args.rounds, sync=sync)
    for variant, s in timed.samples.items():
        q1, median, q3 = quartiles([t * 1e3 for t in s])
        out["variants"][variant].update(median_ms=round(median, 3), q1=round(q1, 3), q3=round(q3, 3))
    if "guarded" in results and "thunderfx" in results:
        same = all(torch.equal(a, b) for a, b in zip(results["guarded"], results["thunderfx"], strict=True))
        out["guarded_bitwise_equal_thunderfx"] = same
    if "eager" in results:
        for variant in ("thunderfx", "guarded", "guarded+choice", "inductor"):
            if variant in results:
                diff = max(
                    (a.float() - b.float()).abs().max().item()
                    for a, b in zip(results[variant], results["eager"], strict=True)
                )
                out["variants"][variant]["max_abs_diff_vs_eager"] = diff
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"HF transformers through ThunderFX, {doc['gpu']}, 2 layers, batch 1, {doc['tokens']} tokens, training step "
        f"(loss.backward()), median ms of {doc['rounds']} interleaved rounds (first call s)",
        "",
        "| model | " + " | ".join(doc["variants"]) + " | guarded bitwise = ThunderFX | ThunderFX bitwise = itself |",
        "| --- |" + " --- |" * (len(doc["variants"]) + 2),
    ]
    for m in doc["models"]:
        cells = []
        for v in doc["variants"]:
            r = m["variants"].get(v, {})
            cells.append(
                f"failed: {r['error'][:60]}"
                if "error" in r
                else f"{r.get('median_ms', '-')} ({r.get('first_call_s', '-')} s)"
            )
        lines.append(
            f"| {m['model']} | "
            + " | ".join(cells)
            + f" | {m.get('guarded_bitwise_equal_thunderfx', '-')} | {m.get('thunderfx_repeat_bitwise_equal', '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["phi", "gpt_neox", "opt", "llama"])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa", help="transformers' attention implementation")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/gpu")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: %(default)s")
    p.add_argument("--tag", default="hf-thunderfx", help="file names: <out>/<tag>.json and .md")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; allowed: {', '.join(VARIANTS)}")
    import torch

    if args.device == "cpu":
        args.tokens = min(args.tokens, 32)
    # Every variant compiles the same model's forward through Dynamo, each with its own backend: one cache
    # entry per variant, beyond Dynamo's default recompile limit of 8 for a model with several frames.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    doc: dict[str, Any] = {
        "gpu": gpu,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "variants": args.variants,
        "torch": torch.__version__,
        "models": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        try:
            doc["models"].append(run_model(name, args))
        except Exception as e:
            doc["models"].append({"model": name, "variants": {}, "error": f"{type(e).__name__}: {e}"})
            print(f"[{name}] failed: {e}", file=sys.stderr, flush=True)
        (out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1))
        (out / f"{args.tag}.md").write_text(markdown(doc) + "\n")
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # an nvFuser bound lazily (.gpu/setup.sh) dies at interpreter teardown
