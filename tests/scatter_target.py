"""A graph layer whose backward Thunder cannot run fused: scatter_reduce's gradient, registered automatically."""

import torch


def layer(x, index, w):
    h = x @ w
    out = torch.zeros(4, h.shape[1]).scatter_reduce(0, index.unsqueeze(1).expand_as(h), h, reduce="sum")
    return torch.tanh(out).sum()


def make():
    """The layer and its inputs: ``fusion-guard report tests/scatter_target.py:make``."""
    torch.manual_seed(0)
    x, w = torch.randn(10, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    return layer, (x, torch.randint(0, 4, (10,)), w)
