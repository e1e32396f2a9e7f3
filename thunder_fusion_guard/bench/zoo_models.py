"""Models of third-party libraries, built from their libraries' configs and modules with random weights (nothing
is downloaded): Hugging Face transformers, timm, torchvision, torch.nn, e3nn, cuequivariance and torch_geometric,
listed in :data:`ZOO`. One model class is written here, saying so: the graph attention network (two of
torch_geometric's ``GATConv`` layers); the equivariant potentials written for the zoo (the NequIP-style potential
with hand-written tensor products, NequIP assembled from e3nn's own modules, and with cuequivariance-torch's layers)
are in :mod:`.zoo_equivariant`; NequIP and MACE built from their own packages in :mod:`.zoo_potentials`.

Each builder returns a :class:`ZooModel`: the module (eval mode, so dropout draws nothing), the inputs of one
training step, and how the step's loss is read from the module's output. Sizes are small (2 layers where
layered); ``device="cuda"`` builds wider ones, the transformers in bf16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .zoo_base import ZooEntry, ZooModel, _mean_square, _sum, _width
from .zoo_equivariant import cueq_nequip, e3nn_nequip, nequip
from .zoo_potentials import mace_potential, nequip_potential

__all__ = ["ZOO", "ZooEntry", "ZooModel", "e3nn_nequip"]


def _hf_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else torch.float32


def _tokens(device: str, vocab: int, seq: int) -> torch.Tensor:
    batch = 4 if device == "cuda" else 2
    return torch.randint(0, vocab, (batch, seq), device=device)


def _hf(model: nn.Module, device: str) -> nn.Module:
    return model.to(device=device, dtype=_hf_dtype(device)).eval()


class WithLabels(nn.Module):
    """A Hugging Face model called with ``input_ids`` and ``labels``, returning its own loss."""

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, **self.kwargs).loss


def _hf_model(config_name: str, model_name: str, call: dict[str, Any], **config: Any) -> Callable[[str], ZooModel]:
    """A builder of a small Hugging Face model (2 layers, 4 heads, vocabulary 1024) with labels as its inputs."""

    def build(device: str) -> ZooModel:
        import transformers

        hidden = _width(device, 64, 512)
        shape = {"hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": 4}
        if config_name == "T5Config":
            shape = {"d_model": hidden, "d_kv": hidden // 4, "d_ff": 4 * hidden, "num_layers": 2,
                     "num_decoder_layers": 2, "num_heads": 4, "dropout_rate": 0.0,
                     "decoder_start_token_id": 0, "pad_token_id": 0}  # fmt: skip
        made = getattr(transformers, config_name)(vocab_size=1024, attn_implementation="eager", **shape, **config)
        model = _hf(getattr(transformers, model_name)(made), device)
        ids = _tokens(device, 1024, _width(device, 32, 256))
        return ZooModel(WithLabels(model, **call).eval(), (ids, ids), _sum)

    return build


_LLM = {"intermediate_size": 256, "num_key_value_heads": 2, "max_position_embeddings": 1024}


def vit(device: str) -> ZooModel:
    """timm's ViT (tiny, 2 blocks), on 64x64 images."""
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=2, num_classes=10)
    images = torch.randn(_width(device, 2, 32), 3, 64, 64, device=device)
    return ZooModel(model.to(device).eval(), (images,), _mean_square)


def convnext(device: str) -> ZooModel:
    """timm's ConvNeXt (atto), on 64x64 images."""
    import timm

    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    images = torch.randn(_width(device, 2, 32), 3, 64, 64, device=device)
    return ZooModel(model.to(device).eval(), (images,), _mean_square)


def resnet(device: str) -> ZooModel:
    """torchvision's ResNet-18, on 64x64 images (batch norm in eval mode: running statistics)."""
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=10)
    images = torch.randn(_width(device, 2, 32), 3, 64, 64, device=device)
    return ZooModel(model.to(device).eval(), (images,), _mean_square)


def mha_block(device: str) -> ZooModel:
    """torch.nn's TransformerEncoder (2 layers of nn.MultiheadAttention and an MLP), batch first."""
    width = _width(device, 64, 512)
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(_width(device, 2, 4), _width(device, 32, 256), width, device=device)
    return ZooModel(model.to(device).eval(), (x,), _mean_square)


def gat(device: str) -> ZooModel:
    """A 2-layer graph attention network (written here from torch_geometric's ``GATConv``) on a random graph, node
    classification loss."""
    from torch_geometric.nn import GATConv

    class GAT(nn.Module):
        def __init__(self, features: int, hidden: int) -> None:
            super().__init__()
            self.conv1 = GATConv(features, hidden, heads=4)
            self.conv2 = GATConv(4 * hidden, 8, heads=1)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.conv2(torch.nn.functional.elu(self.conv1(x, edge_index)), edge_index)

    nodes = _width(device, 64, 2048)
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, nodes, (2, 8 * nodes), generator=generator).to(device)
    x = torch.randn(nodes, 32, generator=generator).to(device)
    return ZooModel(GAT(32, 16).to(device).eval(), (x, edge_index), _mean_square)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry(
            "hf-bert",
            "transformers",
            "encoder, masked-LM loss",
            _hf_model("BertConfig", "BertForMaskedLM", {}, intermediate_size=256),
            "transformers",
            small=True,
        ),
        ZooEntry(
            "hf-t5",
            "transformers",
            "encoder-decoder",
            _hf_model("T5Config", "T5ForConditionalGeneration", {}),
            "transformers",
        ),
        ZooEntry(
            "hf-llama",
            "transformers",
            "decoder-only LLM",
            _hf_model("LlamaConfig", "LlamaForCausalLM", {"use_cache": False}, **_LLM),
            "transformers",
        ),
        ZooEntry(
            "hf-mixtral",
            "transformers",
            "mixture of experts (4 experts, top 2)",
            _hf_model(
                "MixtralConfig",
                "MixtralForCausalLM",
                {"use_cache": False},
                num_local_experts=4,
                num_experts_per_tok=2,
                **_LLM,
            ),
            "transformers",
        ),
        ZooEntry("timm-vit", "timm", "vision transformer", vit, "timm"),
        ZooEntry("timm-convnext", "timm", "ConvNet", convnext, "timm"),
        ZooEntry("tv-resnet18", "torchvision", "ConvNet with batch norm", resnet, "torchvision"),
        ZooEntry("nn-mha", "torch.nn", "nn.MultiheadAttention encoder", mha_block, "torch", small=True),
        ZooEntry(
            "pyg-gat",
            "torch_geometric",
            "graph attention network (two GATConv layers, assembled here)",
            gat,
            "torch_geometric",
        ),
        ZooEntry(
            "e3nn-nequip",
            "e3nn",
            "NequIP-style potential, energy and forces (tensor products written here)",
            nequip,
            "e3nn",
            small=True,
        ),
        ZooEntry(
            "e3nn-nequip-rewritten",
            "e3nn",
            "the same, with why-not-fused's rewrites (scatter_add, no norm or new_zeros)",
            functools.partial(nequip, rewritten=True),
            "e3nn",
            small=True,
        ),
        ZooEntry(
            "e3nn-nequip-modules",
            "e3nn",
            "NequIP assembled here from e3nn's own modules (TensorProduct, Linear, Gate), energy and forces",
            e3nn_nequip,
            "e3nn",
            small=True,
        ),
        ZooEntry(
            "e3nn-nequip-modules-l3",
            "e3nn",
            "the same, spherical harmonics to l = 3, 16 channels (32 on CUDA), three blocks",
            functools.partial(e3nn_nequip, lmax=3, layers=3, channels=16, cuda_channels=32),
            "e3nn",
        ),
        ZooEntry(
            "nequip",
            "nequip",
            "NequIP from nequip 0.19 (3 layers, l_max 2, 32 features; 100 atoms in a periodic box), energy and forces",
            nequip_potential,
            "nequip",
        ),
        ZooEntry(
            "mace",
            "mace-torch",
            "MACE from mace-torch 0.3.16 (2 interactions, 32x0e+32x1o, max_ell 2, correlation 3; e3nn 0.4.4: an "
            "environment of its own), energy and forces",
            mace_potential,
            "mace",
        ),
        ZooEntry(
            "mace-cueq",
            "mace-torch",
            "the same MACE with cuEquivariance's kernels for its blocks (as MACE's enable_cueq; fused on CUDA)",
            functools.partial(mace_potential, cueq=True),
            "mace,cuequivariance_torch",
        ),
        ZooEntry(
            "cueq-nequip",
            "cuequivariance",
            "the e3nn-built NequIP with cuequivariance-torch's tensor products (fused CUDA kernels on CUDA)",
            cueq_nequip,
            "cuequivariance_torch",
        ),
    ]
}
