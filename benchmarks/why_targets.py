"""TARGETs for ``fusion-guard why`` and ``fusion-guard report`` on a GPU: a litgpt training step at 2 layers, real
widths, bf16, batch 1, 512 tokens (``benchmarks/gpu.sh why`` runs them)."""

from __future__ import annotations

from typing import Any

import torch

from thunder_fusion_guard.bench.cases import litgpt_model


def _litgpt(name: str, device: str) -> tuple[Any, tuple]:
    model = litgpt_model(name, device, 512)
    idx = torch.randint(0, model.config.padded_vocab_size, (1, 512), device=device)
    return model, (idx,)


def llama2(device: str = "cuda") -> tuple[Any, tuple]:
    """litgpt Llama-2-7b-hf, 2 layers: the forward and (the outputs require grad) the backward."""
    return _litgpt("Llama-2-7b-hf", device)


def mistral(device: str = "cuda") -> tuple[Any, tuple]:
    """litgpt Mistral-7B-v0.1, 2 layers."""
    return _litgpt("Mistral-7B-v0.1", device)
