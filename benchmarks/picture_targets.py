"""TARGETs for ``fusion-guard report --html``: a nanoGPT block and litgpt Llama-2 with one layer.

    python3 -m thunder_fusion_guard report benchmarks/picture_targets.py:nanogpt_block --html block.html
    python3 -m thunder_fusion_guard report benchmarks/picture_targets.py:llama2_layer --html llama2.html

On CUDA at the sizes of the benchmarks (bf16; the block 4 sequences of 512 tokens of width 768, Llama-2-7b's real width
with 512 tokens); on CPU small and in float32, so the pictures can be tried anywhere.
"""

from __future__ import annotations

import torch


def nanogpt_block(device: str = "cpu") -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A nanoGPT transformer block and its input (requires grad: the backward is reported too); the one the
    benchmark suites time."""
    from thunder_fusion_guard.bench.cases import nanogpt_block as make

    torch.manual_seed(0)
    block, x = make(device, requires_grad=True)
    return block, (x,)


def llama2_layer(device: str = "cpu") -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """litgpt's Llama-2-7b with one layer (real width on CUDA, 512 tokens) and a batch of token ids."""
    import litgpt
    from litgpt.model import GPT

    torch.manual_seed(0)
    if device == "cuda":
        config = litgpt.Config.from_name("Llama-2-7b-hf", n_layer=1)
        tokens = 512
    else:
        small = dict(n_embd=64, n_head=4, n_query_groups=4, head_size=16, intermediate_size=128, block_size=64)
        config = litgpt.Config.from_name("Llama-2-7b-hf", n_layer=1, vocab_size=256, padded_vocab_size=256, **small)
        tokens = 32
    with torch.device(device):
        model = GPT(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.max_seq_length = tokens
    x = torch.randint(0, config.padded_vocab_size, (1, tokens), device=device)
    return model, (x,)
