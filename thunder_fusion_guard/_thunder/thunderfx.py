"""What ThunderFX made: its split subgraphs and the Thunder programs compiled of them, the ops its splitter kept
out of Thunder and why, and reading a subgraph's fx module (its user's line, Dynamo's example outputs, who reads
its outputs)."""

from __future__ import annotations

import operator
import re
import sys
from dataclasses import dataclass
from typing import Any

import thunder
import torch

from .compiling import _THUNDERFX_OPTION, function_name
from .sources import fx_node_source
from .translations import library_ops_are_translated, translation_for

__all__ = [
    "FxSplitOp",
    "FxSubgraph",
    "compiled_module",
    "dynamo_graph_label",
    "dynamo_graph_of",
    "fx_module_source",
    "fx_output_examples",
    "inductor_pieces",
    "is_thunderfx",
    "replace_subgraph",
    "split_graph_owner",
    "split_graph_readers",
    "split_reason_words",
    "thunderfx_compiler_on_stack",
    "thunderfx_function_name",
    "thunderfx_split_ops",
    "thunderfx_subgraph_module",
    "thunderfx_subgraphs",
    "thunderfx_transforms",
]


def thunderfx_transforms(obj: Any) -> list[Any]:
    """The transforms passed to a ThunderFX object (``thunderfx(...)`` or a ``ThunderCompiler``)."""
    backend = getattr(obj, "_backend", obj)
    options = getattr(backend, "thunder_options", None)
    if not isinstance(options, dict):
        return []
    return list(options.get("transforms") or [])


def dynamo_graph_label(index: int) -> str:
    """How the guard names the ``index``-th Dynamo graph ThunderFX's backend received (``dynamo graph 0``)."""
    return f"dynamo graph {index}"


@dataclass(frozen=True)
class FxSubgraph:
    """One subgraph ThunderFX split off and compiled with Thunder.

    ``graph`` indexes the Dynamo graphs the backend received, ``name`` is Thunder's name for the split
    submodule (``thunder_0``), ``module`` the fx GraphModule Thunder compiled and ``jitted`` its
    ``thunder.jit`` result; ``split_reasons`` says why Thunder split the Dynamo graph (empty when it did not).
    """

    graph: int
    name: str
    module: torch.fx.GraphModule
    jitted: Any
    split_reasons: tuple[str, ...] = ()
    owner: Any = None  # the split GraphModule that calls it, as its attribute ``name``

    @property
    def label(self) -> str:
        return f"{dynamo_graph_label(self.graph)}, {self.name}"


def is_thunderfx(obj: Any) -> bool:
    """True for a ``thunderfx(...)`` result or a ``ThunderCompiler`` backend."""
    from thunder.dynamo import ThunderCompiler  # loads torch._dynamo: only when asked

    return isinstance(getattr(obj, "_backend", obj), ThunderCompiler)


def thunderfx_subgraphs(obj: Any) -> list[FxSubgraph]:
    """Every Thunder-compiled subgraph of a ThunderFX object so far, in the order the backend made them."""
    if not is_thunderfx(obj):
        raise TypeError(f"{type(obj).__name__} is not a thunderfx object or a ThunderCompiler")
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        nodes = {n.name: n for n in info.original_graph_module.graph.nodes}
        reasons = tuple(dict.fromkeys(_split_reason_text(r, nodes) for r in info.split_reasons or ()))
        compiled = list(info.thunder_compiled_fns or ())
        for name, child in info.split_graph_module.named_children():
            if any(child is fn for fn in compiled):
                found.append(FxSubgraph(index, name, compiled_module(child), child, reasons, info.split_graph_module))
    return found


@dataclass(frozen=True)
class FxSplitOp:
    """One node of a Dynamo graph that ThunderFX kept out of Thunder (it runs through Inductor between the
    Thunder subgraphs): its name and target, the splitter's reason (``kind`` is the ``SplitReasonType``
    name), the user's source line and the bytes of its tensor inputs and outputs."""

    graph: int
    node: str
    target: str
    kind: str
    info: str
    exception: str | None
    source: str | None
    nbytes: int | None


_SPLIT_NODE = re.compile(r"node with name: (\S+) and target: ")


def thunderfx_split_ops(obj: Any) -> list[FxSplitOp]:
    """The nodes ThunderFX's splitter kept out of Thunder in every Dynamo graph of ``obj`` so far, in order."""
    found = []
    for index, info in enumerate(getattr(obj, "_backend", obj).subgraph_infos):
        nodes = {n.name: n for n in info.original_graph_module.graph.nodes}
        for reason in info.split_reasons or ():
            text = getattr(reason, "info", None) or ""
            match = _SPLIT_NODE.search(text)
            node = nodes.get(match.group(1)) if match else None
            found.append(
                FxSplitOp(
                    index,
                    node.name if node is not None else (match.group(1) if match else "?"),
                    _target_name(node) if node is not None else "?",
                    _split_kind(reason),
                    text,
                    getattr(reason, "exception", None),
                    fx_node_source(node),
                    _node_bytes(node),
                )
            )
    return found


def _target_name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return f"Tensor.{target}" if node.op == "call_method" else target
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if module and module not in ("builtins", "_operator") else name


def _node_bytes(node: Any) -> int | None:
    """Bytes of the tensors ``node`` reads and writes, from Dynamo's fake example values (None if unknown)."""
    if node is None:
        return None
    values = [node.meta.get("example_value")] + [a.meta.get("example_value") for a in node.all_input_nodes]
    tensors = {id(v): v for v in values if isinstance(v, torch.Tensor)}
    try:
        return sum(int(v.numel()) * v.element_size() for v in tensors.values())
    except Exception:  # symbolic sizes
        return None


def replace_subgraph(sub: FxSubgraph, runner: torch.nn.Module) -> None:
    """From the next call on, the split GraphModule that called ``sub``'s Thunder program calls ``runner``."""
    setattr(sub.owner, sub.name, runner)


# What each of ThunderFX's split reasons (``SplitReasonType``) means, in the user's words.
_SPLIT_WORDS = {
    "MISSING_OP_SUPPORT": "Thunder has no mapping for it",
    "UNSUPPORTED_NODE": "it is in a context Thunder does not support",
    "EXCEPTION_PROXY_THUNDER_OP": "Thunder failed to trace it",
    "EXCEPTION_META_THUNDER_OP": "Thunder failed to trace it",
}
# A callable's repr as ThunderFX's splitter quotes it: ``<built-in method cat of type object at 0x7f...>``.
_CALLABLE_REPR = re.compile(r"<(?:built-in )?(?:method|function) ([\w.]+)[^>]*>")


def _split_kind(reason: Any) -> str:
    """The ``SplitReasonType`` name of one of ThunderFX's split reasons (``split`` where it has none)."""
    return getattr(getattr(reason, "reason_type", None), "name", "split")


def split_reason_words(kind: str, info: str) -> str:
    """Why ThunderFX kept a node out of Thunder, in words: its ``SplitReasonType`` name ``kind`` and the splitter's
    ``info`` read (one wording for the split notes of reports and the rows of ``why_not_fused``)."""
    if "automatic torch fallback" in info:
        return "Thunder has only an automatic torch fallback for it"
    return _SPLIT_WORDS.get(kind, "ThunderFX split the graph here")


def _split_reason_text(reason: Any, nodes: dict[str, Any]) -> str:
    """One split note as a user reads it: the function as they write it (``torch.cat``, no object address), why
    it left Thunder (for an op the package translates, that ``translate_library_ops()`` keeps it in Thunder) and
    the first line of the error; the same for every node of that function that left for the same reason, so that
    a report lists it once."""
    info = getattr(reason, "info", None) or ""
    match = _SPLIT_NODE.search(info)
    node = nodes.get(match.group(1)) if match else None
    if node is not None:
        target = _target_name(node)
    else:
        target = _CALLABLE_REPR.sub(r"\1", info.split(" and target: ", 1)[-1].split(" ", 1)[0]) or "?"
    text = f"{target}: {split_reason_words(_split_kind(reason), info)}"
    translatable = translation_for([target]) is not None and not library_ops_are_translated()
    if "automatic torch fallback" in info and translatable:
        text += "; translate_library_ops() runs it in Thunder"
    exception = (getattr(reason, "exception", None) or "").strip()
    return f"{text} ({exception.splitlines()[0]})" if exception else text


def thunderfx_function_name(obj: Any) -> str | None:
    """The name of the function or module a ``thunderfx(...)`` result compiles."""
    fn = getattr(obj, "_func", None)
    return function_name(getattr(fn, "_orig_mod", fn))


def compiled_module(jitted: Any) -> Any:
    """The function or module a ``thunder.jit`` result compiles (None if it is not one)."""
    cd = thunder.compile_data(jitted)
    return None if cd is None else getattr(cd, "fn", None)


def thunderfx_subgraph_module(jitted: Any) -> torch.fx.GraphModule | None:
    """The fx GraphModule of a ThunderFX split subgraph's ``thunder.jit`` result (a ThunderModule); None for any
    other jitted function or module."""
    cd = getattr(jitted, "_lc_cd", None)
    module = getattr(jitted, "_model", None)
    options = getattr(cd, "compile_options", None) or {}
    if isinstance(module, torch.fx.GraphModule) and _THUNDERFX_OPTION in options:
        return module
    return None


def fx_module_source(gm: torch.fx.GraphModule) -> str | None:
    """``file:line`` of the user's code of the first op of ``gm`` that Dynamo recorded a stack for."""
    for node in gm.graph.nodes:
        if node.op.startswith("call_") and (found := fx_node_source(node)):
            return found
    return None


def fx_output_examples(gm: torch.fx.GraphModule) -> list[Any]:
    """Dynamo's example value of each output of ``gm`` in order (None for one it has none of); a ``gm`` that returns
    one value, not a tuple, has one."""
    (output,) = gm.graph.find_nodes(op="output")
    returned = output.args[0]
    returned = returned if isinstance(returned, (tuple, list)) else [returned]
    return [getattr(n, "meta", {}).get("example_value") for n in returned]


def split_graph_owner(jitted: Any) -> tuple[torch.fx.GraphModule, torch.fx.Node] | None:
    """The split GraphModule calling the ThunderFX subgraph ``jitted`` (its ThunderModule) and the node that calls
    it. Found on the call stack, so only while the split graph runs; None where no calling split graph is found."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.fx.GraphModule):
            for node in owner.graph.nodes:
                if node.op == "call_module" and getattr(owner, str(node.target), None) is jitted:
                    return owner, node
        frame = frame.f_back
    return None


def thunderfx_compiler_on_stack() -> Any | None:
    """The ThunderFX backend (Thunder 0.2.6's ``ThunderCompiler``) splitting a Dynamo graph, found on the call stack
    while its splitter compiles a subgraph with ``thunder.jit``; None elsewhere."""
    from thunder.dynamo.compiler import ThunderCompiler

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), ThunderCompiler):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


def dynamo_graph_of(compiler: Any, split: torch.fx.GraphModule) -> tuple[int, torch.fx.GraphModule] | None:
    """The index among the Dynamo graphs ``compiler`` (a ThunderFX backend) split and the Dynamo GraphModule whose
    split is ``split``; None where it split no such graph."""
    for index, info in enumerate(getattr(compiler, "subgraph_infos", ())):
        if info.split_graph_module is split:
            return index, info.original_graph_module
    return None


def split_graph_readers(jitted: Any) -> list[set[str]] | None:
    """For each output of the ThunderFX subgraph ``jitted`` (its ThunderModule), what reads it in the split graph
    calling it: ``thunder`` (another Thunder subgraph), ``other`` (a part ThunderFX compiled with Inductor or runs
    eagerly) or ``output`` (the graph's own output). Found on the call stack, so only while the split graph runs;
    None where no calling split graph is found."""
    found = split_graph_owner(jitted)
    return None if found is None else _readers(*found)


def inductor_pieces(owner: torch.fx.GraphModule) -> list[tuple[str, torch.nn.Module, torch.fx.Graph]]:
    """The parts of the split GraphModule ``owner`` that ThunderFX compiled with Inductor, in order: the attribute
    naming each (``inductor_1``), the module it calls and the fx graph that module was compiled from, returning what
    ``owner`` reads of the call. Thunder 0.2.6 wraps Inductor's compiled function in a module keeping the graph as
    ``graph``, which Inductor may have made return a one-element list where the call gives the value itself; a part
    it runs eagerly (a fx GraphModule already) is none of these."""
    found = []
    for node in owner.graph.find_nodes(op="call_module"):
        name, child = str(node.target), getattr(owner, str(node.target), None)
        graph = getattr(child, "graph", None)
        if (
            name.startswith("inductor_")
            and not isinstance(child, torch.fx.GraphModule)
            and isinstance(graph, torch.fx.Graph)
        ):
            whole = any(user.target is not operator.getitem for user in node.users)  # not a tuple: read whole
            found.append((name, child, _returning_one(graph) if whole else graph))
    return found


def _returning_one(graph: torch.fx.Graph) -> torch.fx.Graph:
    """``graph`` returning its one output itself where it returns it in a one-element list or tuple (a copy)."""
    (output,) = graph.find_nodes(op="output")
    returned = output.args[0]
    if not (isinstance(returned, (list, tuple)) and len(returned) == 1):
        return graph
    copied = torch.fx.Graph()
    values = copied.graph_copy(graph, {})
    copied.output(values[0])
    return copied


def _readers(owner: torch.fx.GraphModule, node: torch.fx.Node) -> list[set[str]]:
    def kind(user: torch.fx.Node) -> str:
        if user.op == "output":
            return "output"
        if user.op == "call_module" and isinstance(getattr(owner, str(user.target), None), thunder.ThunderModule):
            return "thunder"
        return "other"

    getitems = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
    if not getitems or len(getitems) != len(node.users):
        return [{kind(u) for u in node.users}]
    readers: dict[int, set[str]] = {}
    for g in getitems:
        readers.setdefault(int(g.args[1]), set()).update(kind(u) for u in g.users)
    return [readers.get(i, set()) for i in range(max(readers) + 1)]
