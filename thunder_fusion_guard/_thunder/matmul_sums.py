"""A post-grad pass the guard hands Inductor for one compile of a whole Dynamo graph: each matmul whose result is small
(at most :data:`SMALL_RESULT` values) computed as a sum of products, which Inductor fuses into the kernel that makes
its operands, instead of a GEMM launch of its own.

What Inductor's own small-matmul rewrite (``decompose_mm_pass``) leaves in an e3nn or MACE step are mostly the weights'
gradients: 8 x 8 to 32 x 32 results summed over hundreds of rows (``x.T @ grad``), one GEMM launch each in a step that
is a queue of tiny launches. No Inductor option does this; the guard times a compile with it and keeps it only where
faster (:mod:`..whole_graph`). Given as ``post_grad_custom_post_pass`` in that compile's options: torch's config is not
touched."""

from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

__all__ = ["SMALL_RESULT", "SUMMED_MATMULS", "WIDE_RESULT", "WIDE_SUMMED_MATMULS", "SummedMatmuls", "summed_shape"]

# The most values a matmul's result may have to be summed in a kernel: one thread block's reduction a value, each
# over the inner dimension (e3nn's and MACE's weight gradients: 8 x 8 to 32 x 32, and 64 x 64).
SMALL_RESULT = 4096
# The most a second, wider compile sums, tried where summing those of SMALL_RESULT paid: on the zoo's small e3nn step
# (H200) it takes 12 of the 15 GEMMs the narrower sum leaves, for the same device time.
WIDE_RESULT = 65536

aten = torch.ops.aten
_convert = torch.ops.prims.convert_element_type.default
# Low-precision operands are multiplied and summed in float32 and rounded once, as a GEMM accumulates.
_WIDENED = (torch.float16, torch.bfloat16)


def summed_shape(left: Any, right: Any, most: int = SMALL_RESULT) -> bool:
    """Whether ``mm(left, right)`` (fake tensors of Inductor's post-grad graph) is summed: static 2-D floating operands
    of one dtype whose result has at most ``most`` values and whose inner dimension is more than 1."""
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return False
    if left.dim() != 2 or right.dim() != 2 or left.dtype != right.dtype or not left.dtype.is_floating_point:
        return False
    sizes = (*left.shape, right.shape[1])
    if not all(isinstance(n, int) for n in sizes):  # a symbolic size: its result's size is unknown here
        return False
    rows, inner, columns = sizes
    return inner > 1 and 0 < rows * columns <= most


@functools.cache
def _stable_topological_sort() -> Any:
    """Inductor's topological sort, imported at the first graph the pass rewrites: importing Inductor's pattern
    matcher costs 0.7 s, which a process that never compiles with the pass should not pay."""
    from torch._inductor.pattern_matcher import stable_topological_sort

    return stable_topological_sort


class SummedMatmuls(CustomGraphPass):
    """Rewrites ``aten.mm(a, b)`` of a result of at most ``most`` values into ``sum(a[:, :, None] * b[None], 1)``
    (:func:`summed_shape`)."""

    def __init__(self, most: int = SMALL_RESULT) -> None:
        self.most = most

    def __call__(self, graph: torch.fx.Graph) -> None:
        # Inductor's batching of matmuls (``batch_linear_post_grad``) may leave the graph out of order until its own
        # sort, which runs after this pass: a node inserted before a matmul must come after its operands
        _stable_topological_sort()(graph)
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.mm.default or len(node.args) != 2:
                continue
            left, right = node.args
            if not summed_shape(_val(left), _val(right), self.most):
                continue
            with graph.inserting_before(node):
                summed = _summed(graph, left, right, _val(left).dtype)
            summed.meta.update({k: v for k, v in node.meta.items() if k != "val"})
            summed.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(summed)
            graph.erase_node(node)

    def uuid(self) -> Any:
        """Inductor's cache key for graphs compiled with this pass: its code and threshold."""
        source = inspect.getsource(SummedMatmuls) + inspect.getsource(summed_shape) + inspect.getsource(_summed)
        return hashlib.sha256(f"{source}{self.most}".encode()).hexdigest()


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _summed(graph: torch.fx.Graph, left: torch.fx.Node, right: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    """The nodes of ``sum(left[:, :, None] * right[None], 1)``, widened to float32 for half-precision operands."""

    def call(op: Any, *args: Any) -> torch.fx.Node:
        node = graph.call_function(op, args)
        values = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        node.meta["val"] = op(*values)  # fake tensors: shapes, dtypes and strides for Inductor's lowering
        return node

    if dtype in _WIDENED:
        left, right = call(_convert, left, torch.float32), call(_convert, right, torch.float32)
    products = call(aten.mul.Tensor, call(aten.unsqueeze.default, left, 2), call(aten.unsqueeze.default, right, 0))
    summed = call(aten.sum.dim_IntList, products, [1])
    return call(_convert, summed, dtype) if dtype in _WIDENED else summed


# The options handing Inductor the pass for one compile (``torch._inductor.compile``'s config patches).
SUMMED_MATMULS: dict[str, Any] = {"post_grad_custom_post_pass": SummedMatmuls()}
# The same for the wider compile, of matmuls with up to WIDE_RESULT values.
WIDE_SUMMED_MATMULS: dict[str, Any] = {"post_grad_custom_post_pass": SummedMatmuls(WIDE_RESULT)}
