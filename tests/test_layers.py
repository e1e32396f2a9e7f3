"""The package's imports point one way: every module imports only modules of its own layer or lower ones, and
no import cycle exists. Read from the source with ``ast``, imports inside functions and ``TYPE_CHECKING``
blocks included, so a lazy import cannot hide an edge."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "thunder_fusion_guard"

# Lowest first. A module may import its own layer's modules and those of the layers before it.
LAYERS = [
    ["_version", "wording", "shims", "_quiet", "progress", "phases", "replays"],  # no torch or Thunder
    ["library_forwards"],  # library modules' forwards in plain torch (e3nn's Extract out of place); no Thunder
    ["_thunder"],  # the only place touching Thunder's internals (and the nvFuser compat fix)
    ["ops"],  # every rule about ops
    # cuda_graphs: GuardedCUDAGraphs, the package's CUDAGraphTransform (the ops' rule for writes)
    ["regions", "shipped_constants", "cost", "options", "decisions", "cuda_graphs", "reasons", "distributed"],
    ["render"],  # a leaf: text tables and pictures; reads decisions, profiles, graphs and why rows by attribute
    ["report"],
    ["policy"],  # a region's fate
    ["passes"],  # the hoist runtime included
    ["measure"],  # what runs while compiling: calibration, its cache, break-even timing
    # ThunderFX subgraphs run another way: after a failure, or chosen by timing; pieces and subgraphs run eagerly
    # whole_graph: a Dynamo graph unguarded Thunder fails on, run whole by Inductor where timed faster
    ["fx_rescue", "whole_graph", "backend_choice", "fx_pieces"],
    ["transform", "step_graph"],  # step_graph: a whole step in one CUDA graph (torch only)
    ["examine"],  # after compiling: explain, calls, profile, segments, dataflow, bandwidth, why and its parts
    ["bench"],  # the benchmark harness: cases, interleaved timing, decision accuracy, side-by-side profiles, zoo
    ["tools"],  # the command line
    ["__init__", "__main__"],
]
LAYER_OF = {top: index for index, names in enumerate(LAYERS) for top in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _imports(path: Path) -> set[str]:
    """Modules of the package that ``path`` imports, as dotted names relative to the package."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("thunder_fusion_guard."):
                    found.add(alias.name.removeprefix("thunder_fusion_guard."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("thunder_fusion_guard"):
                target = node.module.removeprefix("thunder_fusion_guard").lstrip(".")
            else:
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}" if target else alias.name
                # ``from .. import Name`` of a name that is no module: the package's facade, ``__init__``
                found.add(candidate if candidate in MODULES else (target or "__init__"))
    return {name for name in found if name and name != module}


MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}
GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    return LAYER_OF[module.split(".")[0]]


def test_every_module_has_a_layer():
    assert {m.split(".")[0] for m in MODULES} <= set(LAYER_OF), "a new top-level module needs its place in LAYERS"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    upward = sorted(t for t in GRAPH[module] if _layer(t) > _layer(module))
    assert not upward, f"{module} imports higher layers: {upward}"


def test_an_import_of_the_facade_counts_as_upward(tmp_path):
    """``from .. import FusionGuard`` in a lower module imports the package's ``__init__``, the top layer."""
    (tmp_path / "thunder_fusion_guard" / "bench").mkdir(parents=True)
    module = tmp_path / "thunder_fusion_guard" / "bench" / "x.py"
    module.write_text("from .. import FusionGuard\nfrom ..transform import guards_of\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "thunder_fusion_guard"
    try:
        assert _imports(module) == {"__init__", "transform"}
    finally:
        PACKAGE = saved


def test_no_import_cycle():
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for target in sorted(GRAPH.get(module, ())):
            if target != module:
                visit(target, [*path, module])
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, [])


def test_the_walk_sees_lazy_imports():
    """The graph holds imports made inside functions (tools import the library lazily)."""
    assert "examine.dataflow" in GRAPH["tools.report_cli"]
