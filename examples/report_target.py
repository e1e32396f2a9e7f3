"""An example TARGET for ``fusion-guard report``: attention heads split and merged by einops, graph breaks between.

    python -m thunder_fusion_guard report examples/report_target.py:make
    python -m thunder_fusion_guard report examples/report_target.py:make --thunderfx --json report.json

Under ThunderFX the graph breaks cut the model into subgraphs, and the rearranges that split the heads
end up alone in a subgraph: the metadata-only regions the guard sends back to PyTorch.
"""

from __future__ import annotations

import torch
from einops import rearrange


class Attention(torch.nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        torch._dynamo.graph_break()
        q, k, v = rearrange(qkv, "b s (three h d) -> three b h s d", three=3, h=self.heads)
        torch._dynamo.graph_break()
        weights = torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)
        return self.out(rearrange(weights @ v, "b h s d -> b s (h d)"))


def make(device: str = "cpu") -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The model and its example input; the input requires grad, so the backward is reported too."""
    torch.manual_seed(0)
    model = Attention().to(device)
    x = torch.randn(2, 16, 64, device=device, requires_grad=True)
    return model, (x,)
